"""MkDocs hook: every bundled checkpoint's model card (``checkpoints/<name>/model_card.md``) becomes a page of
the site, ``cards/<name>.md``, at build time: the cards are the one home of each checkpoint's own numbers
(how it was trained, how it was evaluated, its tables), and the results pages link to them instead of
repeating them. The nav gets a "Model cards" section listing them."""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "checkpoints"


def cards() -> dict[str, str]:
    """name -> the card's markdown, for every bundled checkpoint that has one."""
    return {d.name: (d / "model_card.md").read_text() for d in sorted(CHECKPOINTS.iterdir())
            if (d / "model_card.md").is_file()}


def page(name: str, card: str) -> str:
    """The card as a page: its own text, with a line saying where it lives and how it is served."""
    head = (f"*The model card of `checkpoints/{name}/`, as bundled; a running server serves it at "
            f"`GET /models/{name}/card`.*\n\n")
    lines = card.split("\n")
    title = lines[0] if lines and lines[0].startswith("# ") else f"# {name}"
    body = "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines)
    return f"{title} (`{name}`)\n\n{head}{body}"


def on_files(files, config):
    for name, card in cards().items():
        files.append(File.generated(config, f"cards/{name}.md", content=page(name, card)))
    return files


def on_config(config):
    entries = [{name: f"cards/{name}.md"} for name in cards()]
    nav = config.get("nav") or []
    config["nav"] = [item for item in nav if "Model cards" not in item] + [{"Model cards": entries}]
    return config
