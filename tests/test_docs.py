"""The documentation: a README a newcomer reads in minutes, and a site that builds strictly (a broken link,
a missing page, a docstring that does not render) with the HTTP API generated from the live OpenAPI."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_short_and_links_only_existing_pages():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in __import__("re").findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", readme):
        assert (ROOT / target).is_file(), target


def test_http_api_page_is_generated_from_the_openapi_document():
    from openapi_page import render, service_openapi

    page = render(service_openapi())
    assert "## POST `/generate`" in page and "## POST `/score`" in page and "## POST `/v1/completions`" in page
    assert "| `num_samples` | integer |" in page and "### GenerateRequest" in page


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "http-api" / "index.html").read_text().count("num_samples") >= 2
    for card in (ROOT / "checkpoints").glob("*/model_card.md"):  # each card is a page of the site
        page = (tmp_path / "site" / "cards" / card.parent.name / "index.html").read_text()
        assert "GET /models/" in page and card.parent.name in page


@pytest.mark.slow
def test_documented_recipe_commands_name_real_scripts_configs_and_flags():
    """Every `python training/<recipe>.py ...` command in the README and the docs names a recipe that exists, a
    config that exists and only flags the recipe's parser knows (commands joined across line continuations)."""
    import re

    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = []
    for path in texts:
        joined = re.sub(r"\\\n\s*", " ", path.read_text())
        commands += [(path.name, m.group(0)) for m in re.finditer(r"python3? training/\w+\.py[^\n`]*", joined)]
    assert len(commands) > 20
    helps = {}
    for where, command in commands:
        script = re.search(r"training/(\w+\.py)", command).group(1)
        assert (ROOT / "training" / script).is_file(), (where, command)
        if script not in helps:
            done = subprocess.run([sys.executable, str(ROOT / "training" / script), "--help"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (script, done.stderr[-2000:])
            helps[script] = done.stdout
        own = command.split(" -- ")[0]  # after " -- ": another recipe's arguments (ray_train.py)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", own):
            assert flag in helps[script], (where, command, flag)
        config = re.search(r"--config (\S+)", command)
        if config and not config.group(1).endswith(".yaml"):
            assert (ROOT / "training" / "configs" / f"{config.group(1)}.yaml").is_file(), (where, command)


_NUMBER = __import__("re").compile(r"(?<![\w.+\-=/])\d+\.\d+(?![\w.]|\.\d)")
RESULT_PAGES = ("results-qm9.md", "text.md", "results-moses.md", "concepts.md", "benchmarks.md")


def _tables_and_prose(text: str) -> tuple[list[str], list[str]]:
    """Lines of tables (markdown rows, fenced and indented blocks) and lines of prose (code spans dropped)."""
    import re

    tables, prose, fence = [], [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fence = not fence
        elif fence or line.lstrip().startswith("|") or line.startswith("    "):
            tables.append(line)
        else:
            prose.append(re.sub(r"`[^`]*`", "", line))
    return tables, prose


def _row_numbers(line: str) -> tuple[str, ...]:
    return tuple(_NUMBER.findall(line))


def test_results_state_each_measured_number_in_one_place():
    """A served checkpoint's own tables live in its card: no results page repeats a row of a card; and no
    page's prose restates a number of its own tables or of a card (checked for numbers of four or more
    significant digits, where a coincidence is unlikely; shorter ones are kept to differences by review)."""
    cards = {p.parent.name: p.read_text() for p in (ROOT / "checkpoints").glob("*/model_card.md")}
    card_rows = {_row_numbers(line) for text in cards.values() for line in _tables_and_prose(text)[0]}
    card_rows = {row for row in card_rows if len(row) >= 4}
    card_numbers = {n for text in cards.values() for line in _tables_and_prose(text)[0] for n in _row_numbers(line)}
    for name in RESULT_PAGES:
        tables, prose = _tables_and_prose((ROOT / "docs" / name).read_text())
        for line in tables:
            assert _row_numbers(line) not in card_rows, f"{name} repeats a model card's row: {line.strip()}"
        own = {n for line in tables for n in _row_numbers(line)} | card_numbers
        for line in prose:
            for n in _row_numbers(line):
                assert len(n.replace(".", "").lstrip("0")) < 4 or n not in own, f"{name} restates {n}: {line}"


def test_readme_results_are_the_served_cards_numbers():
    """The README's small tables are the served checkpoints' random-order validity, read from their cards (the
    one copy the docs make, kept equal by this test), each row at the K of the header above it."""
    import re

    sys.path.insert(0, str(ROOT / "docs_hooks"))
    from model_cards import random_order_rows

    rows, steps = 0, None
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("| checkpoint |"):
            steps = [int(k) for k in re.findall(r"K = (\d+)", line)]
        elif re.match(r"\| `[\w-]+` ", line):
            name = re.match(r"\| `([\w-]+)`", line).group(1)
            card = random_order_rows((ROOT / "checkpoints" / name / "model_card.md").read_text())
            assert list(_row_numbers(line)) == [card[k]["validity %"] for k in steps], (name, line)
            rows += 1
    assert rows >= 3  # the two full-sequence checkpoints and the block one


def test_a_card_cell_expands_into_the_cards_own_numbers():
    sys.path.insert(0, str(ROOT / "docs_hooks"))
    from model_cards import cards, expand_card_cells

    table = "| validity % (FCD) | K = 4 | K = 22 |\n| --- | --- | --- |\n| TT | card:qm9-tt-r16 |\n"
    lines = (ROOT / "checkpoints" / "qm9-tt-r16" / "model_card.md").read_text().splitlines()
    split = lambda line: [x.strip() for x in line.strip().strip("|").split("|")]  # noqa: E731
    columns = split(next(line for line in lines if line.startswith("| ordering | K | avg steps |")))
    rows = [dict(zip(columns, split(line))) for line in lines
            if line.startswith("| random | 4 |") or line.startswith("| random | 22 |")]
    want = [f"{r['validity %']} ({r['FCD']})" for r in rows]
    assert expand_card_cells(table, cards()).splitlines()[2] == f"| TT | {want[0]} | {want[1]} |"
    with pytest.raises(ValueError, match="no bundled checkpoint"):
        expand_card_cells(table.replace("qm9-tt-r16", "qm9-tt-r99"), cards())
    with pytest.raises(ValueError, match="lacks"):
        expand_card_cells(table.replace("K = 22", "K = 64"), cards())
