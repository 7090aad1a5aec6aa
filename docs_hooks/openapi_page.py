"""MkDocs hook: the HTTP API page is generated from the service's own OpenAPI document at build time
(never retyped): every route, its request fields (type, default, rule, description) and its answers.
The page's source holds the marker ``<!-- openapi -->`` where the generated reference goes."""

import json
import logging
import tempfile

MARKER = "<!-- openapi -->"


def _type(schema: dict, components: dict) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if "enum" in schema:
        return " / ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "anyOf" in schema:
        kinds = [_type(s, components) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(kinds) + (" or null" if nullable else "")
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}), components)}"
    return kind


RULES = (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"), ("exclusiveMaximum", "< {}"),
         ("minLength", "at least {} characters"), ("maxLength", "at most {} characters"),
         ("minItems", "at least {} items"), ("maxItems", "at most {} items"), ("pattern", "matches `{}`"))


def _rule(schema: dict) -> str:
    found = []
    for s in [schema, *schema.get("anyOf", [])]:
        found += [fmt.format(s[key]) for key, fmt in RULES if key in s]
    return "; ".join(dict.fromkeys(found))


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _fields(name: str, components: dict) -> list[str]:
    schema = components[name]
    required = set(schema.get("required", []))
    rows = ["| field | type | default | rule | description |", "| --- | --- | --- | --- | --- |"]
    for field, spec in schema.get("properties", {}).items():
        default = "required" if field in required else f"`{json.dumps(spec.get('default'))}`"
        rows.append(f"| `{field}` | {_cell(_type(spec, components))} | {_cell(default)} | {_cell(_rule(spec))} | "
                    f"{_cell(spec.get('description', ''))} |")
    return rows


def render(openapi: dict) -> str:
    components = openapi.get("components", {}).get("schemas", {})
    out, models = [], []
    for path, methods in openapi["paths"].items():
        for method, op in methods.items():
            out += [f"## {method.upper()} `{path}`", ""]
            if op.get("description") or op.get("summary"):
                out += [op.get("description") or op.get("summary"), ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | default | rule | description |",
                        "| --- | --- | --- | --- | --- | --- |"]
                for p in params:
                    s = p.get("schema", {})
                    out.append(f"| `{p['name']}` | {p['in']} | {_cell(_type(s, components))} | "
                               f"`{json.dumps(s.get('default'))}` | {_cell(_rule(s))} | "
                               f"{_cell(p.get('description', ''))} |")
                out.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if "$ref" in body:
                name = body["$ref"].rsplit("/", 1)[-1]
                out += [f"Request body: [`{name}`](#{name.lower()})", ""]
                models.append(name)
            out += ["| status | answer |", "| --- | --- |"]
            for status, answer in op.get("responses", {}).items():
                out.append(f"| {status} | {_cell(answer.get('description', ''))} |")
            out.append("")
    out += ["## Request bodies", ""]
    for name in dict.fromkeys(models):
        out += [f"### {name}", "", *_fields(name, components), ""]
    return "\n".join(out)


def service_openapi() -> dict:
    """The live app's OpenAPI document (no checkpoints needed: the routes do not depend on them)."""
    from service.app import create_app
    from service.engine import Engine
    from service.registry import ModelRegistry
    from service.serving import Serving

    logging.getLogger("ttcore.registry").setLevel(logging.CRITICAL)  # "no checkpoints" is expected here
    with tempfile.TemporaryDirectory() as empty:
        return create_app(Serving(ModelRegistry(empty), Engine())).openapi()


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render(service_openapi()))
