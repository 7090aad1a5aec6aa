"""The paper's comparison with the autoregressive side (issue: the AR baselines): a family's AR model beside the
diffusion checkpoints, and the samplers that consult it, EDLM and DCD (``ttcore.sampling.steps.edlm`` / ``dcd``),
over the rank-1 diffusion checkpoint paired with it.

    python benchmarks/ar_baselines.py quality --diffusion checkpoints/qm9-none-r1 checkpoints/qm9-cp-r64 \
        checkpoints/qm9-tt-r16 --ar runs/qm9-ar --samples 1024 --steps 2 4 8 22 --fcd [--http]
    python benchmarks/ar_baselines.py speed --diffusion checkpoints/text-tt-r4 --steps 128 --samples 2 --repeats 1
    python benchmarks/ar_baselines.py speed --diffusion checkpoints/qm9-none-r1 checkpoints/qm9-tt-r16 \
        checkpoints/qm9-cp-r64 --ar runs/qm9-ar --steps 22 --samples 16
    python benchmarks/ar_baselines.py quality --diffusion checkpoints/qm9-none-r1 --ar runs/qm9-ar --samples 1024 \
        --steps 2 4 8 --dcd-chunks 2 4 --fcd
    python benchmarks/ar_baselines.py quality --diffusion checkpoints/qm9-tt-r16 --ar runs/qm9-ar --samples 1024 \
        --steps 2 4 8 22 --joint-edlm [--edlm-candidates 2 4] --fcd
    python benchmarks/ar_baselines.py quality --diffusion runs/qm9-b4-r1 runs/qm9-b4-tt-r8 --ar runs/qm9-ar24 \
        --samples 1024 --block-steps 1 2 4 --block-eb 0.1 0.5 --nll --fcd
    python benchmarks/ar_baselines.py quality --diffusion DIR/qm9-base DIR/qm9-tt-r2 --ar DIR/qm9-ar --samples 8 \
        --steps 2 [--dcd-chunks 1 2] [--joint-edlm --edlm-candidates 2 3]                              # smoke
    python benchmarks/ar_baselines.py speed --diffusion DIR/text-base --steps 4 --samples 2 --batch 2  # smoke

``quality`` samples, in process, ``--samples`` molecules a cell (random order, seeded, bf16 where the CPU has it):
for each rank-1 diffusion checkpoint MDLM's own step, EDLM (k = 2, w = 1) and DCD with the AR checkpoint ``--ar``
paired to it; for each joint checkpoint (CP, TT) its joint step; and the AR checkpoint at one token a step (K = its
length). Validity (one molecule), uniqueness, novelty and, with ``--fcd``, FCD to the family's held-out split.
``--dcd-chunks 1 2 4`` adds DCD's rows at those chunk sizes (chunks of adjacent positions in random order);
A block diffusion checkpoint (``training/train_blocks.py``) has a row per k in ``--block-steps`` (k steps a block,
``sampler: blocks``; K = k x its blocks; at k >= 2 one per ordering inside a block in ``--block-orderings``), and
with ``--block-eb`` a row per budget of EB-Sampler inside each block (``block_eb_gamma``; K its length, the cap).
Every row says the steps a sample took on average (the steps that committed any of its tokens: K, or fewer when EB
decides or a step unmasks nothing). ``--nll`` adds each exact
likelihood (the AR model's, a block model's at one step a block: ``ModelKind.exact_nll``) on the whole held-out
split, nats per position; ``--grammar`` the block rows again under the SMILES grammar; ``--rank-one-view`` a
joint block checkpoint's rows again with ``joint: false`` (each position of a block from its exact marginal: the
same network without the joint draw); ``--temperatures 1 0.8`` every row once per temperature (a TT's cores
tempered one by one: a law of its own, not p(x)^(1/T); docs: concepts, temperature).
``--joint-edlm`` EDLM's rows over each CP / TT checkpoint, whose joint is then EDLM's proposal (``--edlm-candidates
2 4``: a row per k).
``--http`` asks an embedded server (links to the checkpoints in a temporary folder; the service pairs the AR
checkpoint itself) through ``/generate``, in requests of at most 256 seeded as the in-process batches are.
``speed`` times, side by side in one process, the seconds per sequence of a generation at ``--steps`` steps, batch
size 1 (as the paper's sampling-time table, tab:owt-time, measures it; ``--batch`` B: B sequences a generation):
MDLM, the joint steps of the ``--diffusion`` checkpoints, EDLM and DCD over the MDLM, and the AR model. When the
first checkpoint is a joint one, the MDLM is a rank-1 model of its shape with random weights, and without ``--ar``
so is the AR model: their seconds are those of trained ones (timing only; the paper runs EDLM and DCD over MDLM and
SEDD, rank-1 models).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from ttcore.sampling import ADAPTIVE, PREDETERMINED

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "training"))


def _rows(diffusion, ar, ar_name: str, steps: list[int], dcd_chunks: list[int] = (1,),
          joint_edlm: bool = False, edlm_candidates: list[int] = (2,), block_steps: list[int] = (1,),
          grammar: bool = False, rank_one_view: bool = False, block_eb: list[float] = (),
          block_orderings: list[str] = ("random",)) -> list[tuple]:
    """(label, checkpoint name, model, K, settings) of every cell; DCD once per chunk size (``dcd_chunk``);
    ``joint_edlm``: EDLM over each joint checkpoint too (its joint as the proposal), once per candidate count
    in ``edlm_candidates``; a block diffusion checkpoint at k steps a block for each k in ``block_steps`` (K = k
    times its blocks, ``sampler: blocks``) instead of ``steps``, with ``grammar`` again under the SMILES
    grammar, with ``rank_one_view`` again (a joint head's) with ``joint: false``, each position of a block from its
    exact marginal, and for each budget in ``block_eb`` with EB-Sampler inside each block (``block_eb_gamma``; K:
    the cap, its length); at k >= 2 once per ordering in ``block_orderings`` (inside each block; at k = 1 every
    ordering draws the whole block in one step, one law: its row once)."""
    cells = []
    for name, model in diffusion:
        size = model.cfg.dit.block_size
        if size:
            head = f"{model.cfg.decomposition.upper()} r={model.cfg.rank}" if model.format.joint_head else "rank 1"
            blocks = model.cfg.dit.length // size
            variants = {"": {}, " + grammar": {"grammar": "smiles"} if grammar else None,
                        " rank-1 view": {"joint": False} if rank_one_view and model.format.joint_head else None}
            for suffix, extra in ((s, e) for s, e in variants.items() if e is not None):
                orders = [(k, o) for k in block_steps if k <= size for o in block_orderings
                          if k > 1 or o == block_orderings[0]]
                cells += [(f"block b={size} k={k}{'' if o == 'random' else ' ' + o} {head}{suffix} ({name})", name,
                           model, k * blocks, {"sampler": "blocks", **({} if o == "random" else {"ordering": o}),
                                               **extra}) for k, o in orders]
                cells += [(f"block b={size} EB {g:g} {head}{suffix} ({name})", name, model, model.cfg.dit.length,
                           {"sampler": "blocks", "block_eb_gamma": g, **extra}) for g in block_eb]
        elif model.format.joint_head:
            head = f"{model.cfg.decomposition.upper()} r={model.cfg.rank}"
            cells += [(f"{head} ({name})", name, model, k, {}) for k in steps]
            if ar is not None and joint_edlm:
                cells += [(f"EDLM{f' k={c}' if c != 2 else ''} over {head} ({name} + {ar_name})", name, model, k,
                           {"sampler": "edlm", "edlm_candidates": c}) for c in edlm_candidates for k in steps]
        else:
            cells += [(f"MDLM ({name})", name, model, k, {}) for k in steps]
            if ar is not None:
                cells += [(f"EDLM ({name} + {ar_name})", name, model, k, {"sampler": "edlm"}) for k in steps]
                cells += [(f"DCD{f' c={c}' if c > 1 else ''} ({name} + {ar_name})", name, model, k,
                           {"sampler": "dcd", **({"dcd_chunk": c} if c > 1 else {})})
                          for c in dcd_chunks for k in steps]
    if ar is not None:
        cells.append((f"AR ({ar_name})", ar_name, ar, ar.cfg.dit.length, {"ordering": "left_to_right"}))
    return cells


def _served(args) -> tuple:
    """The checkpoints on an embedded server (``served_overhead``'s: uvicorn, one thread), from a folder of links
    to them -> (process, URL)."""
    from served_overhead import _start

    root = Path(tempfile.mkdtemp(prefix="ar-baselines-"))
    for path in [*args.diffusion, *([args.ar] if args.ar else [])]:
        (root / Path(path).name).symlink_to(Path(path).resolve())
    return _start(ROOT, root, args.precision)


def _over_http(url: str, name: str, n: int, k: int, batch: int, seed: int, settings: dict
               ) -> tuple[list, float, float]:
    """``n`` samples of checkpoint ``name`` from ``/generate``, in requests of ``batch`` seeded as ``run_setting``
    seeds its batches (seed + offset) -> (texts, seconds, the mean steps a sample took: the steps that committed
    any of its tokens). A run whose samples take steps of their own (EB inside a block) is streamed, each step
    event saying what each sample committed; another's samples all commit in the steps that commit anything."""
    texts, steps, t0 = [], [], time.perf_counter()
    for s in range(0, n, batch):
        body = {"checkpoint": name, "num_samples": min(batch, n - s), "steps": k, "seed": seed + s,
                "timeout_s": 600, **settings}
        if "block_eb_gamma" in settings:
            with httpx.stream("POST", url + "/generate", json=dict(body, stream=True), timeout=900) as r:
                events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
            if r.status_code != 200 or "samples" not in events[-1]:
                raise SystemExit(f"{body}: {r.status_code} {events[-1] if events else ''}")
            answer = events[-1]
            steps += [sum(bool(e["committed"][i]) for e in events if "committed" in e)
                      for i in range(body["num_samples"])]
        else:
            r = httpx.post(url + "/generate", json=body, timeout=900)
            if r.status_code != 200:
                raise SystemExit(f"{body}: {r.status_code} {r.text[:300]}")
            answer = r.json()
            steps += [sum(t > 0 for t in answer["tokens_per_step"])] * body["num_samples"]
        texts += [sample["text"] for sample in answer["samples"]]
    return texts, time.perf_counter() - t0, sum(steps) / len(steps)


def quality(args) -> None:
    from _common import dataset
    from _report import data_section

    from ttcore.kinds import kind_of, pair
    from ttcore.models import load_for_inference
    from ttcore.recipes import TrainConfig

    diffusion = [(Path(p).name, load_for_inference(p, "cpu", args.precision)[0]) for p in args.diffusion]
    ar, tok, _ = load_for_inference(args.ar, "cpu", args.precision) if args.ar else (None, None, None)
    tok = tok or load_for_inference(args.diffusion[0], "cpu", args.precision)[1]
    for _, model in diffusion:
        if ar is not None and kind_of(model.cfg).takes_companion and (args.joint_edlm or not model.format.joint_head):
            pair(model, ar)
    ds = dataset(TrainConfig(data=data_section(args.data, Path(args.diffusion[0]))))
    training = set(ds.train)
    reference = None
    if args.fcd:
        from ttcore.metrics.distribution import Reference

        reference = Reference(next(iter(ds.references.values())), "cpu")
    proc, url = _served(args) if args.http else (None, None)
    print(f"{'method':>50} | {'K':>3} | {'steps / seq':>11} | {'valid %':>7} | {'unique %':>8} | {'novel %':>7} | "
          f"{'FCD':>6} | {'s':>6}" + (" (through HTTP)" if args.http else " (in process)"))
    try:
        for label, name, model, k, settings in _rows(diffusion, ar, Path(args.ar).name if args.ar else "",
                                                     args.steps, args.dcd_chunks, args.joint_edlm,
                                                     args.edlm_candidates, args.block_steps, args.grammar,
                                                     args.rank_one_view, args.block_eb, args.block_orderings):
            for t in args.temperatures:
                suffix, tempered = ("", {}) if t == 1 else (f" T={t:g}", {"temperature": t})
                _cell(args, label + suffix, name, model, k, {**settings, **tempered}, tok, url, training, reference)
        if args.nll:
            _nll_rows(args, diffusion, ar, ds)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)


def _cell(args, label, name, model, k, settings, tok, url, training, reference) -> None:
    """One row of ``quality``: sampled in process, or through the server at ``url``."""
    from _report import run_setting

    from ttcore.metrics import molecule_metrics

    if url is None:
        if settings.get("grammar"):  # in process: the grammar's automaton over the checkpoint's tokens
            from ttcore.constraints import smiles_dfa

            settings = dict(settings, constraint=smiles_dfa(tok.pieces(range(tok.vocab_size)), tok.pad_id))
            del settings["grammar"]
        res = run_setting(model, tok, args.samples, k, args.batch or 256, args.seed, **settings)
        texts, seconds, steps = res["texts"], res["seconds"], res["avg_steps"]
    else:
        texts, seconds, steps = _over_http(url, name, args.samples, k, min(args.batch or 256, 256), args.seed,
                                           settings)
    m = molecule_metrics(texts, training)
    fcd = reference.compare(texts).get("fcd") if reference is not None else None
    fcd = float("nan") if fcd is None else fcd  # none asked, or fewer than two valid molecules
    pct = lambda x: f"{100 * x:.1f}" if x is not None else "-"  # noqa: E731 (none valid: no uniqueness)
    print(f"{label:>50} | {k:>3} | {steps:>11.2f} | {pct(m['validity']):>7} | {pct(m['uniqueness']):>8} | "
          f"{pct(m['novelty']):>7} | {fcd:>6.3f} | {seconds:>6.0f}", flush=True)


@torch.no_grad()
def _nll_rows(args, diffusion, ar, ds) -> None:
    """Each checkpoint with an exact likelihood (the AR model, block diffusion: ``ModelKind.exact_nll``), its
    -log p(x) on the whole held-out split, nats per position (padding included: the same positions for every
    checkpoint of one length)."""
    from ttcore.kinds import kind_of

    val = torch.from_numpy(ds.val_tokens)
    models = [*diffusion, *([(Path(args.ar).name, ar)] if ar is not None else [])]
    print(f"exact -log p(x) on the held-out split ({len(val)} sequences), nats per position:")
    for name, model in models:
        kind = kind_of(model.cfg)
        if not kind.exact_likelihood:
            continue
        if model.cfg.dit.length != val.shape[1]:
            print(f"{name:>44} | - (its length {model.cfg.dit.length}, the split's {val.shape[1]})")
            continue
        with model.compute_context():
            total = sum(float(kind.exact_nll(model, val[s:s + 256])) * len(val[s:s + 256])
                        for s in range(0, len(val), 256))
        print(f"{name:>44} | {total / len(val):.4f} (length {model.cfg.dit.length})", flush=True)
        if model.cfg.dit.block_size > 1:  # the same network's other exact laws: one token a step, no joint draw
            _block_laws(name, model, val)


@torch.no_grad()
def _block_laws(name, model, val) -> None:
    """A block checkpoint's two other exact likelihoods on the held-out split, nats per position: b steps a block
    left to right (``block_chain_log_prob``: each position's exact marginal given the block's earlier ones) and
    its rank-1 view at one step a block (``joint: false``: each position's exact marginal given none of its
    block). Beside the k = 1 joint's they say how much of what the network knows one joint draw carries."""
    from ttcore.sampling.blocks import block_chain_log_prob, block_score

    size, chain, view = model.cfg.dit.block_size, 0.0, 0.0
    with model.compute_context():
        for s in range(0, len(val), 256):
            x = val[s:s + 256]
            chain -= float(block_chain_log_prob(model, x).sum())
            view -= float(block_score(model, x, torch.ones_like(x, dtype=torch.bool))[1].sum())
    n = val.numel()
    print(f"{name + f' k={size} left to right':>44} | {chain / n:.4f} (length {model.cfg.dit.length})")
    if model.format.joint_head:
        print(f"{name + ' rank-1 view':>44} | {view / n:.4f} (length {model.cfg.dit.length})", flush=True)


def speed(args) -> None:
    from _report import run_setting

    from ttcore.kinds import pair
    from ttcore.models import JointModel, ModelConfig, load_for_inference, prepare_for_inference

    model, tok, _ = load_for_inference(args.diffusion[0], "cpu", args.precision)
    if args.ar:
        ar, _, _ = load_for_inference(args.ar, "cpu", args.precision)
        ar_label = Path(args.ar).name
    else:  # the diffusion checkpoint's shape, random weights: a trained model's seconds (timing only)
        torch.manual_seed(0)
        shape = {k: v for k, v in vars(model.cfg.dit).items() if k not in ("causal", "latent_dim")}
        ar = prepare_for_inference(JointModel(ModelConfig(type(model.cfg.dit)(**shape, causal=True))),
                                   model.precision)
        ar_label = "random weights, its shape"
    base, base_label = model, "MDLM"
    if model.format.joint_head:  # MDLM, EDLM and DCD run over a rank-1 model: its shape, random weights (timing)
        torch.manual_seed(0)
        base = prepare_for_inference(JointModel(ModelConfig(model.cfg.dit)), model.precision)
        base_label = "MDLM (random weights, its shape)"
    pair(base, ar)
    k = args.steps[0]
    cases = [(base_label, base, k, {})]
    if model.format.joint_head:
        cases.append((f"MDLM+{model.cfg.decomposition.upper()} r={model.cfg.rank} ({Path(args.diffusion[0]).name})",
                      model, k, {}))
    for path in args.diffusion[1:]:  # more checkpoints: their own joint steps
        other = load_for_inference(path, "cpu", args.precision)[0]
        cases.append((f"MDLM+{other.cfg.decomposition.upper()} r={other.cfg.rank} ({Path(path).name})", other, k, {}))
    cases += [("EDLM (k = 2, w = 1)", base, k, {"sampler": "edlm"}),
              ("DCD", base, k, {"sampler": "dcd"}),
              (f"AR ({ar_label}, KV cache)", ar, ar.cfg.dit.length, {"ordering": "left_to_right"}),
              (f"AR ({ar_label}, no KV cache)", ar, ar.cfg.dit.length, {"ordering": "left_to_right",
                                                                        "kv_cache": False})]
    times, batch = {label: [] for label, *_ in cases}, args.batch or 1
    for label, m, steps, settings in cases:  # warm-up: allocator, kernels, the first call's imports
        run_setting(m, tok, 1, min(steps, 2) if m is not ar else steps, 1, args.seed, **settings)
    for r in range(args.repeats):  # alternating: each method's repeats spread over the same stretch of time
        for label, m, steps, settings in cases:
            seconds = run_setting(m, tok, args.samples, steps, batch, args.seed + r, **settings)["seconds"]
            times[label].append(seconds / args.samples)
    print(f"{Path(args.diffusion[0]).name}, {args.precision}, batch size {batch}, median of {args.repeats} "
          f"(seconds per sequence)")
    print(f"{'method':>44} | {'K':>4} | {'s / seq':>8} | {'x MDLM':>7}")
    first = statistics.median(times[cases[0][0]])
    for label, _, steps, _ in cases:
        t = statistics.median(times[label])
        print(f"{label:>44} | {steps:>4} | {t:>8.4f} | {t / first:>7.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["quality", "speed"])
    ap.add_argument("--diffusion", nargs="+", required=True, help="diffusion checkpoint directories")
    ap.add_argument("--ar", help="the family's autoregressive checkpoint (training/train_ar.py)")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--steps", type=int, nargs="+", default=[2, 4, 8, 22])
    ap.add_argument("--batch", type=int, help="sequences a generation (quality: 256; speed: 1, the paper's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precision", default="auto", help="fp32, bf16 or auto (bf16 where the CPU has it)")
    ap.add_argument("--dcd-chunks", type=int, nargs="+", default=[1],
                    help="quality: DCD's rows at these chunk sizes (dcd_chunk; 1 = random order, the TT paper's)")
    ap.add_argument("--fcd", action="store_true", help="quality: FCD to the held-out split")
    ap.add_argument("--joint-edlm", action="store_true",
                    help="quality: EDLM over each CP / TT checkpoint too, its joint as the proposal")
    ap.add_argument("--edlm-candidates", type=int, nargs="+", default=[2],
                    help="quality, with --joint-edlm: EDLM's k over the joint checkpoints (one row each)")
    ap.add_argument("--data", help="quality: the data that novelty, FCD and the likelihood are measured against (a "
                                   "corpus: qm9, moses; or a file); default: the first --diffusion checkpoint's")
    ap.add_argument("--block-eb", type=float, nargs="+", default=[],
                    help="quality: a block checkpoint's rows with EB-Sampler inside each block at these budgets "
                         "(block_eb_gamma; K its length, the cap)")
    ap.add_argument("--block-steps", type=int, nargs="+", default=[1],
                    help="quality: a block diffusion checkpoint's k steps a block (a row each; k <= its block size)")
    ap.add_argument("--block-orderings", nargs="+", default=["random"], choices=sorted({*PREDETERMINED, *ADAPTIVE}),
                    help="quality: a block checkpoint's rows at k >= 2 steps a block once per ordering inside the "
                         "block (top_prob, margin, entropy: adaptive; left_to_right)")
    ap.add_argument("--grammar", action="store_true", help="quality: each block checkpoint's rows again under the "
                                                           "SMILES grammar (grammar: smiles)")
    ap.add_argument("--rank-one-view", action="store_true", help="quality: each joint block checkpoint's rows again "
                                                                "with joint: false (the rank-1 view of its joint)")
    ap.add_argument("--nll", action="store_true", help="quality: the exact -log p(x) per position on the held-out "
                                                       "split of each checkpoint with one (AR, block diffusion)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0],
                    help="quality: every row once per temperature (the request's temperature: each core, or each "
                         "marginal, tempered; docs: concepts, temperature)")
    ap.add_argument("--http", action="store_true", help="quality: through /generate of an embedded server (uvicorn, "
                                                        "one thread) instead of in process")
    args = ap.parse_args()
    if args.precision == "auto":
        from ttcore.models import resolve_precision

        args.precision = resolve_precision("auto", torch.device("cpu"))
    {"quality": quality, "speed": speed}[args.part](args)


if __name__ == "__main__":
    main()
