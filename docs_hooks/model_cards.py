"""MkDocs hook: every bundled checkpoint's model card (``checkpoints/<name>/model_card.md``) becomes a page of
the site, ``cards/<name>.md``, at build time: the cards are the one home of each checkpoint's own numbers
(how it was trained, how it was evaluated, its tables), and the results pages link to them instead of
repeating them. The nav gets a "Model cards" section listing them.

A results table that compares a served checkpoint with other runs names it instead of copying its numbers: a
cell ``card:NAME`` in a markdown table row expands, at build time, into that card's random-order cells at
each ``K = n`` of the table's header, ``validity % (FCD)`` (``validity %`` where the card has no FCD)."""

import re
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


CARD_CELL = re.compile(r"\|\s*card:([\w.-]+)\s*\|")


def random_order_rows(card: str) -> dict[int, dict[str, str]]:
    """steps taken -> {column: cell} of the random-order rows of a card's quality table (the first row per
    number of steps taken: K >= l rows repeat K = l)."""
    rows, columns = {}, None
    for line in card.splitlines():
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if row and row[0] == "ordering":
            columns = row if "avg steps" in row else None  # the quality table
        elif columns and len(row) == len(columns) and row[0] == "random":
            values = dict(zip(columns, row))
            rows.setdefault(round(float(values["avg steps"])), values)
    return rows


def random_order_cells(card: str) -> dict[int, str]:
    """steps taken -> "validity (FCD)" ("validity" where the card has no FCD) of the random-order rows."""
    return {k: v["validity %"] + (f" ({v['FCD']})" if v.get("FCD", "-") != "-" else "")
            for k, v in random_order_rows(card).items()}


def expand_card_cells(markdown: str, all_cards: dict[str, str]) -> str:
    """Each ``| label | card:NAME |`` row with NAME's cells at the K of the table's header."""
    out, header = [], ""
    for line in markdown.split("\n"):
        if not line.startswith("|"):
            header = ""
        elif not header:
            header = line
        m = CARD_CELL.search(line) if line.startswith("|") else None
        if m:
            name = m.group(1)
            if name not in all_cards:
                raise ValueError(f"card:{name}: no bundled checkpoint {name} has a model card")
            cells = random_order_cells(all_cards[name])
            steps = [int(k) for k in re.findall(r"K = (\d+)", header)]
            missing = [k for k in steps if k not in cells]
            if not steps or missing:
                raise ValueError(f"card:{name}: the table's header names K {steps}; the card lacks {missing}")
            line = line[:m.start()] + "| " + " | ".join(cells[k] for k in steps) + " |" + line[m.end():]
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    return expand_card_cells(markdown, cards()) if "card:" in markdown else markdown


def on_files(files, config):
    for name, card in cards().items():
        files.append(File.generated(config, f"cards/{name}.md", content=page(name, card)))
    return files


def on_config(config):
    entries = [{name: f"cards/{name}.md"} for name in cards()]
    nav = config.get("nav") or []
    config["nav"] = [item for item in nav if "Model cards" not in item] + [{"Model cards": entries}]
    return config
