"""The quality tables, plots and model-card sections ``evaluate.py`` writes from its rows (one row a checkpoint,
setting and step count)."""

from pathlib import Path

from _report import lines, pyplot, remove_section, replace_section, save_plot, series


def plot(rows: list[dict], orderings: list[str], out: Path) -> None:
    plt = pyplot()

    fixed = [r for r in rows if r["eb_gamma"] is None]
    fig, axes = plt.subplots(1, len(orderings), figsize=(5 * len(orderings), 4), sharey=True, squeeze=False)
    for ax, ordering in zip(axes[0], orderings):
        lines(ax, [r for r in fixed if r["ordering"] == ordering], "steps", "validity", 100)
        ax.set_xscale("log", base=2)
        ax.set_title(ordering)
        ax.set_xlabel("denoising steps K")
    save_plot(fig, axes[0][0], out / "validity.png", "denoising steps K", "validity (%)")
    eb = [r for r in rows if r["eb_gamma"] is not None]
    if eb:
        fig, ax = plt.subplots(figsize=(5, 4))
        lines(ax, eb, "avg_steps", "validity", 100)
        save_plot(fig, ax, out / "eb.png", "average steps (EB-Sampler)", "validity (%)")


CARD_SECTION = "## Few-step quality"
OLD_DISTRIBUTION_SECTION = "## Distribution metrics (MOSES-style)"  # now columns of the quality table


def molecule_cells(r: dict) -> list:
    label = r["ordering"] if r["eb_gamma"] is None else f"EB-Sampler gamma={r['eb_gamma']:g}"
    if r.get("contraction") == "exact":
        label += " (exact contraction)"
    if not r.get("joint", True):
        label += " (rank-1 view, joint: false)"
    if r.get("schedule", "loglinear") != "loglinear" or r.get("temperature", 1.0) != 1.0:
        label += f" (schedule {r.get('schedule', 'loglinear')}, temperature {r.get('temperature', 1.0):g})"
    quality = r.get("quality")  # rows measured before GenMol's quality was a column have none
    return [label, r["steps"], f"{r['avg_steps']:.1f}", f"{100 * r['validity']:.1f}", f"{100 * r['uniqueness']:.1f}",
            f"{100 * r['novelty']:.1f}", "" if quality is None else f"{100 * quality:.1f}"]


MOLECULE_COLUMNS = ["ordering", "K", "avg steps", "validity %", "uniqueness %", "novelty %", "quality %"]
TEXT_COLUMNS = ["ordering", "K", "GenPPL", "unigram entropy", "samples"]


def text_cells(r: dict) -> list:
    view = "" if r.get("joint", True) else " (rank-1 view, joint: false)"
    sampler = r.get("sampler", "random") + (" (fast)" if r.get("adaptive_path", "exact") == "fast" else "")
    return [sampler + view, r["steps"], f"{r['genppl']:.1f}", f"{r['entropy']:.2f}", r["samples"]]


def update_cards(rows: list[dict], paths: list[Path], command: str, columns=MOLECULE_COLUMNS,
                  cells=molecule_cells, section: str = CARD_SECTION, note: str = "") -> None:
    """Replace each checkpoint's model-card ``section`` with its own rows (atomic: temp file, rename)."""
    for path in paths:
        lines = [section, "", f"    {command}", ""] + ([note, ""] if note else []) + [
            "| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
        lines += ["| " + " | ".join(map(str, cells(r))) + " |" for r in rows if r["checkpoint"] == path.name]
        card_path = path / "model_card.md"
        card = card_path.read_text() if card_path.exists() else f"# {path.name}\n"
        tmp = card_path.with_suffix(".md.tmp")
        card = remove_section(card, OLD_DISTRIBUTION_SECTION)  # its columns joined this table
        tmp.write_text(replace_section(card, section, "\n".join(lines)))
        tmp.replace(card_path)


DISTRIBUTION_CARD_COLUMNS = ["FCD", "SNN", "Frag", "Scaf", "IntDiv"]


def distribution_cells(r: dict) -> list:
    """The quality row with the MOSES-style metrics appended ("-" where not measured: EB rows)."""
    return molecule_cells(r) + ["-" if r.get(c) is None else f"{r[c]:.3f}"
                                 for c in ("fcd", "snn", "frag", "scaf", "int_div")]


DISTRIBUTION_COLUMNS = ("n_valid", "fcd", "snn", "frag", "scaf", "int_div")


def print_distribution(rows: list[dict], data_row: dict, n_reference: int) -> None:
    """One line per checkpoint, ordering and K: ``ttcore.metrics.distribution`` against the held-out split,
    beside validity / uniqueness / novelty; first the same metrics for training molecules (the floor that
    sampling noise alone gives at this sample size)."""
    print(f"\nMOSES-style metrics against {n_reference} held-out molecules (FCD lower is better; the rest higher)")
    head = ["checkpoint", "ordering", "K", "valid %", "unique %", "novel %", "FCD", "SNN", "Frag", "Scaf", "IntDiv"]
    print(" | ".join(f"{h:>{24 if i == 0 else 8}}" for i, h in enumerate(head)))

    def line(name, ordering, k, r):
        nums = [f"{100 * r[c]:.1f}" if c in r else "-" for c in ("validity", "uniqueness", "novelty")]
        nums += ["-" if r.get(c) is None else f"{r[c]:.3f}" for c in ("fcd", "snn", "frag", "scaf", "int_div")]
        print(" | ".join([f"{name:>24}", f"{ordering:>8}", f"{k:>8}"] + [f"{x:>8}" for x in nums]))

    line("QM9 training molecules", "-", "-", data_row)
    for r in rows:
        if r["eb_gamma"] is None and r.get("fcd", 0) is not None and "fcd" in r:
            line(series(r), r["ordering"], r["steps"], r)


def print_tables(rows: list[dict], orderings: list[str], steps: list[int]) -> None:
    names = list(dict.fromkeys(map(series, rows)))
    for ordering in orderings:
        print(f"\nvalidity % / uniqueness % / novelty %, ordering {ordering}")
        print(f"{'checkpoint':>16} | " + " | ".join(f"{'K=' + str(k):>15}" for k in steps))
        for name in names:
            cells = []
            for k in steps:
                r = next((r for r in rows if series(r) == name and r["ordering"] == ordering
                          and r["steps"] == k and r["eb_gamma"] is None), None)
                cells.append(f"{100 * r['validity']:4.1f}/{100 * r['uniqueness']:4.1f}/{100 * r['novelty']:4.1f}"
                             if r else "-")
            print(f"{name:>16} | " + " | ".join(f"{c:>15}" for c in cells))
    eb = [r for r in rows if r["eb_gamma"] is not None]
    if eb:
        print("\nEB-Sampler: validity % (average steps)")
        gammas = sorted({r["eb_gamma"] for r in eb})
        print(f"{'checkpoint':>16} | " + " | ".join(f"{'g=' + str(g):>13}" for g in gammas))
        for name in dict.fromkeys(map(series, eb)):
            cells = [next((f"{100 * r['validity']:4.1f} ({r['avg_steps']:4.1f})" for r in eb
                           if series(r) == name and r["eb_gamma"] == g), "-") for g in gammas]
            print(f"{name:>16} | " + " | ".join(f"{c:>13}" for c in cells))
