"""What the evaluation recipes share (``evaluate.py``, ``evaluate_likelihood.py``, ``evaluate_moses.py``): the
checkpoints to read, a sampler setting run in batches, rows written as CSV and JSON, plots, the data a
checkpoint was trained on, model-card sections replaced in place, and a setting's molecules kept on disk (drawn on
one machine, measured on another)."""

import csv
import gzip
import json
import re
import sys
import time
from pathlib import Path

import torch

from ttcore.data import CORPORA, DataSection
from ttcore.errors import InvalidSampler
from ttcore.models import read_train_config
from ttcore.recipes import TrainConfig, public_command
from ttcore.sampling import SamplerConfig, cost, generate, unmask_counts
from ttcore.sampling.schedules import SCHEDULES


def checkpoint_dirs(paths: list[str]) -> list[Path]:
    """Each path is a checkpoint, or a directory of checkpoints."""
    out = []
    for p in map(Path, paths):
        out += [p] if (p / "config.json").exists() else sorted(d for d in p.iterdir() if (d / "config.json").exists())
    return out


def count_schedule(length: int, steps: int, schedule: str = "loglinear") -> tuple[int, ...]:
    """The tokens each model-calling step unmasks from ``length`` masks (idle steps dropped)."""
    n = torch.tensor([length])
    counts = []
    for k in range(steps):
        c = int(unmask_counts(torch.tensor([length]), n, steps, k, SCHEDULES[schedule])[0])
        n = n - c
        if c:
            counts.append(c)
    return tuple(counts)


def rows_within(model, memory_mb: int, **settings) -> int:
    """The most sequences one pass of a step may hold within ``memory_mb`` (``ttcore.sampling.cost``, as the
    server micro-batches), at least one."""
    return max(1, cost.rows_for(model, memory_mb << 20, **settings))


def run_setting(model, tok, n: int, steps: int, batch: int, seed: int, memory_mb: int = 4096,
                deadline: float | None = None, **settings) -> dict | None:
    """``n`` samples in batches; ``settings`` go to ``generate``; each step's passes stay within ``memory_mb``.
    -> texts, their token ids, the average steps a sample took, seconds; None when ``deadline`` (a
    ``time.time()``) passes before the last batch starts (what was drawn is dropped)."""
    ids, per_sample_steps, t0 = [], [], time.time()
    rows = rows_within(model, memory_mb, **settings)
    for k in range(0, n, batch):
        if deadline is not None and time.time() > deadline:
            return None
        b = min(batch, n - k)
        with model.compute_context():
            states = list(generate(model, b, steps, seed=seed + k, max_rows_per_pass=rows, **settings))
        ids += states[-1].tokens.tolist()
        active = torch.stack([s.committed.any(1) for s in states])  # [s, b]: the sample took this step
        per_sample_steps += active.sum(0).tolist()
    return {"texts": [tok.decode(row) for row in ids], "ids": ids,
            "avg_steps": sum(per_sample_steps) / len(per_sample_steps), "seconds": time.time() - t0}


def sampler_settings(sampler: str) -> dict:
    """A ``--text-samplers`` entry as ``generate``'s settings: an ordering, ``eb=GAMMA`` (EB-Sampler) or
    ``block_eb=GAMMA`` (EB-Sampler inside each block of a block model)."""
    name, _, gamma = sampler.partition("=")
    return {f"{name}_gamma": float(gamma)} if gamma else {"ordering": sampler}


def path_matters(**settings) -> bool:
    """Whether ``adaptive_path`` changes how steps with these settings are drawn (the sampler config's step
    class decides: adaptive orderings and EB on the joint have a fast path); settings refused are drawn by
    neither (one line says so)."""
    try:
        return SamplerConfig(**settings, adaptive_path="fast").step.chooses
    except InvalidSampler:
        return False


def refused_line(name: str, label: str, model, error) -> str:
    """What an evaluation prints for a setting ``model``'s kind refuses (``InvalidSampler`` ``error``: EB-Sampler's
    K = 128 on a block model) instead of stopping every other setting."""
    return f"{name:>16} {label:>20}: skipped, {model.cfg.kind.description} refuses it ({error.field}: {error})"


def setting_slug(label: str) -> str:
    """A sampler setting's label as a file name: ``random K=4`` -> random-K4, ``EB gamma=0.5 fast`` ->
    EB-gamma0.5-fast (dots kept: names are built by concatenation, never by suffix)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", label.replace("=", "")).strip("-")


def kept_setting(stem: Path, want: dict) -> dict | None:
    """The molecules a run kept at ``stem`` (``stem.smi.gz``, and ``stem.json`` saying how they were drawn) when
    they were drawn with ``want``; None when none are kept there. Kept with other settings, or fewer than the
    ``.json`` says: SystemExit (another run's molecules are never taken for these)."""
    smi, kept = stem.with_name(stem.name + ".smi.gz"), stem.with_name(stem.name + ".json")
    if not kept.exists():
        return None
    meta = json.loads(kept.read_text())
    if any(meta.get(key) != value for key, value in want.items()):
        raise SystemExit(f"{kept} was drawn with {meta}, not {want}: use another --samples-dir")
    with gzip.open(smi, "rt") as f:
        texts = f.read().split("\n")
    if len(texts) != meta["samples"]:
        raise SystemExit(f"{smi} holds {len(texts)} molecules, its .json says {meta['samples']}")
    return dict(meta, texts=texts, kept=True)


def keep_setting(stem: Path, meta: dict, texts: list[str]) -> None:
    """Keep a setting's molecules at ``stem``: the molecules first, then the ``.json`` that says they are complete
    (a run killed between the two, or while writing either, leaves no setting that looks drawn)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    smi, tmp = stem.with_name(stem.name + ".smi.gz"), stem.with_name(stem.name + ".smi.gz.tmp")
    with gzip.open(tmp, "wt") as f:
        f.write("\n".join(texts))
    tmp.replace(smi)
    kept, tmp = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".json.tmp")
    tmp.write_text(json.dumps(meta))
    tmp.replace(kept)


def kept_or_drawn(stem: Path | None, want: dict, draw, **record) -> dict | None:
    """A setting's molecules: those kept at ``stem`` when drawn with ``want`` (``kept_setting``), else ``draw()``
    (``run_setting``'s result, or None when its deadline passed), kept at ``stem`` with ``want``, the draw's steps
    and seconds and ``record``. ``draw`` None: only kept molecules will do (SystemExit naming the setting)."""
    got = kept_setting(stem, want) if stem is not None else None
    if got is not None:
        return got
    if draw is None:
        raise SystemExit(f"no molecules kept for {want['sampler']!r} at {stem}")
    res = draw()
    if res is None:
        return None
    meta = dict(want, avg_steps=res["avg_steps"], seconds=res["seconds"], **record)
    if stem is not None:
        keep_setting(stem, meta, res["texts"])
    return dict(meta, texts=res["texts"])


def write_rows(rows: list[dict], stem: Path) -> None:
    """rows as CSV and JSON next to each other."""
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=1))


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def series(r: dict) -> str:
    """A checkpoint's line in tables and plots; sampling with the exact contraction, as the rank-1 view, with
    another schedule or temperature is a line of its own."""
    return (r["checkpoint"] + (" exact" if r.get("contraction") == "exact" else "")
            + ("" if r.get("joint", True) else " rank-1 view")
            + ("" if r.get("schedule", "loglinear") == "loglinear" else f" {r['schedule']}")
            + ("" if r.get("temperature", 1.0) == 1.0 else f" T={r['temperature']:g}")
            + ("" if r.get("sampler", "random") == "random" else f" {r['sampler']}")
            + (" fast" if r.get("adaptive_path", "exact") == "fast" else ""))


def lines(ax, rows: list[dict], x: str, y: str, scale: float = 1.0) -> None:
    """One line per checkpoint (and contraction): ``y`` against ``x``."""
    for name in dict.fromkeys(map(series, rows)):
        pts = sorted((r[x], scale * r[y]) for r in rows if series(r) == name)
        ax.plot(*zip(*pts), marker="o", label=name)
    ax.grid(alpha=0.3)


def save_plot(fig, ax, path: Path, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def data_section(data: str | None, path: Path | None) -> DataSection:
    """``--data`` (a corpus or a file, read as the checkpoint's tokenizer and metrics say), or the data section
    the checkpoint was trained on; checkpoints without a recorded config, and no checkpoint (None): QM9's."""
    values = read_train_config(path) if path is not None else None
    trained = TrainConfig.from_dict(values).data if values is not None else DataSection()
    if data is None or data == trained.source:
        return trained
    if data in CORPORA:
        return DataSection(source=data)
    return DataSection(source=data, tokenizer=trained.tokenizer, metrics=trained.metrics)


def train_config(path: Path) -> TrainConfig:
    """The training config the checkpoint records (``train_config.json``)."""
    values = read_train_config(path)
    if values is None:
        raise SystemExit(f"{path.name} has no train_config.json (written by the recipes and export.py): its "
                         "validation split and batch size are unknown")
    return TrainConfig.from_dict(values)


def this_command() -> str:
    """The command line that is running, as a card records it (``public_command``: no paths of this machine)."""
    return public_command(["python", f"training/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def _section_span(card: str, title: str) -> tuple[int, int]:
    """(start, end) of section ``title`` in ``card``, up to the next ``## `` heading; start -1 when absent."""
    start = card.find("\n" + title + "\n")
    end = card.find("\n## ", start + 1) if start >= 0 else -1
    return start, (end if end >= 0 else len(card))


def replace_section(card: str, title: str, body: str) -> str:
    """``card`` with its section ``title`` (up to the next ``## `` heading) replaced by ``body``, or with
    ``body`` appended when it has none."""
    start, end = _section_span(card, title)
    if start < 0:
        return card.rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n"
    return card[:start].rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n" + card[end:]


def remove_section(card: str, title: str) -> str:
    """``card`` without its section ``title`` (up to the next ``## `` heading), unchanged when it has none."""
    start, end = _section_span(card, title)
    return card if start < 0 else card[:start].rstrip("\n") + "\n" + card[end:]
