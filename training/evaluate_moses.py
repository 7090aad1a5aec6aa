"""The MOSES benchmark table: checkpoints trained on MOSES, sampled at each number of steps and with
EB-Sampler, in MOSES's columns (``ttcore.metrics.moses``), beside the published baseline rows.

    python training/evaluate_moses.py --checkpoints checkpoints/moses-none-r1 checkpoints/moses-tt-r8 \
        --samples 30000 --steps 4 8 16 32 64 --eb-gammas 0.5 1.0 --out results/moses

MOSES's protocol samples 30,000 molecules per setting (``--samples``; fewer say so in every row: Unique@10k
needs 10,000 valid). References: MOSES's test and scaffold-test sets (176k molecules each; computed once
and cached under ``TTCORE_CACHE``); ``--reference-limit N`` uses the first N of each instead (quick runs,
and the tests), which the table's caption then states. Novelty is against the training split as shipped.
Writes ``moses.csv`` / ``moses.json`` (every row) and ``moses.md`` (the table), and prints the table.

Sampling and measuring can run on different machines: ``--samples-dir DIR`` keeps each setting's molecules
(``DIR/<checkpoint>/<setting>.smi.gz`` and its ``.json``: steps, seconds, seed, precision, device) and reuses
the ones already there; ``--sample-only`` stops after sampling (no RDKit needed: a GPU lease samples, this
machine measures), within ``--max-minutes`` (a setting not finished by then is left for the next run). The
settings go K-major (each K for every checkpoint, the smaller K first), so a run cut short leaves whole
comparisons.
"""

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

from _report import checkpoint_dirs, kept_or_drawn, refused_line, run_setting, setting_slug, this_command, write_rows

from ttcore.data import moses_files, read_sequences
from ttcore.data.qm9 import default_cache_dir
from ttcore.errors import InvalidSampler
from ttcore.models import load_for_inference

# the metrics (RDKit, ChemNet) are imported where they are measured: --sample-only runs where RDKit is not


def settings(steps: list[int], gammas: list[float], eb_max_steps: int, adaptive_path: str = "exact",
             rank_one_view: bool = False) -> list[tuple[str, int, dict]]:
    """(label, K, generate's keyword arguments): random order at each K, then EB-Sampler at each gamma, by
    the exact chain rule or on the fast path (the service's default; the label says ``fast``). With
    ``rank_one_view``, a CP / TT checkpoint also in random order drawing each position from its exact marginal
    (``joint: false``: the same network without its joint)."""
    out = []
    for k in steps:  # each K's view beside its joint row: a run cut short leaves whole comparisons
        out.append((f"random K={k}", k, {"ordering": "random"}))
        out += [(f"random K={k} rank-1 view", k, {"ordering": "random", "joint": False})] if rank_one_view else []
    fast = " fast" if adaptive_path == "fast" else ""
    out += [(f"EB gamma={g:g}{fast}", eb_max_steps, {"eb_gamma": g, "adaptive_path": adaptive_path})
            for g in gammas]
    return out


def _cell(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict], caption: str) -> str:
    """Markdown: the published rows, then ours."""
    from ttcore.metrics.moses import COLUMNS, HEADERS, PUBLISHED
    head = ["model", "sampler", "steps"] + HEADERS
    lines = [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
    for name, values in PUBLISHED.items():
        cells = [f"{m:g} ({s:g})" if s else f"{m:g}" for m, s in values]
        cells += ["-"] * (len(COLUMNS) - len(cells))  # GenMol's quality: not published for these models
        lines.append(f"| {name} (published) | | | {' | '.join(cells)} |")
    for r in rows:
        cells = [_cell(r.get(c)) for c in COLUMNS]
        lines.append(f"| {r['checkpoint']} | {r['sampler']} | {r['avg_steps']:.1f} | {' | '.join(cells)} |")
    return "\n".join(lines) + f"\n\n{caption}\n"


def sample_setting(model, tok, args, label: str, k: int, kw: dict, stem: Path | None,
                   deadline: float | None) -> dict | None:
    """One setting's molecules and how they were drawn: read from ``stem`` (``--samples-dir``) when a run with
    the same samples, seed and precision left them there, else drawn (and kept at ``stem``). None: the
    deadline passed first."""
    want = {"samples": args.samples, "seed": args.seed, "precision": args.precision, "sampler": label, "steps": k}
    return kept_or_drawn(stem, want, partial(run_setting, model, tok, args.samples, k, args.batch, args.seed,
                                             args.memory_mb, deadline, **kw), device=args.device, batch=args.batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", nargs="+", required=True, help="checkpoint directories, or directories of them")
    ap.add_argument("--out", help="where the table goes (not with --sample-only)")
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--steps", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--eb-gammas", type=float, nargs="*", default=[0.5, 1.0])
    ap.add_argument("--eb-max-steps", type=int, default=128)
    ap.add_argument("--adaptive-path", choices=["exact", "fast"], default="exact",
                    help="EB-Sampler by the exact chain rule or on the fast path (the service's default)")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-mb", type=int, default=4096)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reference-limit", type=int, help="use the first N molecules of each test set (quick runs)")
    ap.add_argument("--samples-dir", help="keep each setting's molecules here, and reuse those already here")
    ap.add_argument("--sample-only", action="store_true", help="sample into --samples-dir and stop (no metrics)")
    ap.add_argument("--max-minutes", type=float, help="start no sampling batch after this many minutes")
    ap.add_argument("--rank-one-view", action="store_true",
                    help="also draw each CP / TT checkpoint's rank-1 view (its exact marginals) at each K")
    args = ap.parse_args()
    if args.sample_only != (args.out is None) or (args.sample_only and not args.samples_dir):
        ap.error("give --out (the table), or --sample-only with --samples-dir")
    deadline = time.time() + 60 * args.max_minutes if args.max_minutes is not None else None
    samples_dir = Path(args.samples_dir) if args.samples_dir else None
    paths = checkpoint_dirs(args.checkpoints)
    models = {path: load_for_inference(path, args.device, args.precision)[:2] for path in paths}
    plan = settings(args.steps, args.eb_gammas, args.eb_max_steps, args.adaptive_path, args.rank_one_view)
    asked = [(path, setting) for setting in plan for path in paths  # K-major: a run cut short leaves whole
             if setting[2].get("joint", True) or models[path][0].format.joint_head]  # comparisons; views of joints
    drawn = {}
    for path, (label, k, kw) in asked:
        model, tok = models[path]
        stem = samples_dir / path.name / setting_slug(label) if samples_dir else None
        try:
            got = sample_setting(model, tok, args, label, k, {**kw, **model.cfg.kind.request_defaults()}, stem,
                                 deadline)  # a block model drawn by its kind's sampler
        except InvalidSampler as e:  # a setting its kind does not take (EB or K = 128 on a block model)
            print(refused_line(path.name, label, model, e), flush=True)
            continue
        if got is None:
            print(f"stopped at {args.max_minutes:g} minutes before {path.name} {label}: "
                  f"{len(drawn)} of {len(asked)} settings drawn")
            return 3
        drawn[path, label] = got
        print(f"{path.name:>16} {label:>14}: {args.samples} samples, {got['avg_steps']:.1f} steps, "
              f"{got['seconds']:.1f} s" + (" (kept from an earlier run)" if got.get("kept") else ""), flush=True)
    if args.sample_only:
        return 0
    from ttcore.metrics.distribution import Reference
    from ttcore.metrics.moses import COLUMNS, HEADERS, PUBLISHED_SOURCE, moses_row

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = moses_files()
    train = set(read_sequences(files["train"]))
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    refs = {}
    for name in ("test", "test_scaffolds"):
        smiles = read_sequences(files[name])[: args.reference_limit]
        refs[name] = Reference.cached(smiles, default_cache_dir() / "moses-references", device)
    rows = []
    for path, (model, _) in models.items():
        for label, k, _ in plan:
            if (path, label) not in drawn:  # a rank-1 view of a rank-1 checkpoint
                continue
            got = drawn[path, label]
            row = {"checkpoint": path.name, "decomposition": model.cfg.decomposition, "rank": model.cfg.rank,
                   "sampler": label, "steps": k, "avg_steps": got["avg_steps"], "seconds": got["seconds"],
                   **moses_row(got["texts"], train, refs["test"], refs["test_scaffolds"])}
            rows.append(row)
            print(f"{path.name:>16} {label:>14}: " + ", ".join(
                f"{h} {_cell(row.get(c), 3)}" for h, c in zip(HEADERS, COLUMNS)), flush=True)
    sizes = {name: len(ref.smiles) for name, ref in refs.items()}
    where = {got.get("device", "cpu") for got in drawn.values()}
    caption = (f"Ours: {args.samples} samples per row (seed {args.seed}, {args.precision}, drawn on "
               f"{', '.join(sorted(where))}), against "
               f"{sizes['test']} test and {sizes['test_scaffolds']} scaffold-test molecules"
               + (f" (the first {args.reference_limit} of each, not MOSES's full sets)" if args.reference_limit else "")
               + f"; steps: the average denoising steps a sample took. Published: {PUBLISHED_SOURCE}.\n\n"
               f"    {this_command()}")
    write_rows(rows, out / "moses")
    (out / "moses.md").write_text(table(rows, caption))
    (out / "moses_meta.json").write_text(json.dumps({"references": sizes, "samples": args.samples}))
    print("\n" + table(rows, caption))
    return 0


if __name__ == "__main__":
    sys.exit(main())
