"""Cost of joint (CP / TT) sampling against rank 1 with the same backbone, side by side in one run.

    python benchmarks/sampling_overhead.py            # QM9-sized and text-sized models
    python benchmarks/sampling_overhead.py --quick    # QM9-sized only, fewer settings
    python benchmarks/sampling_overhead.py --size smoke --reps 1    # a 2-block toy: seconds (the tests run it)
    python benchmarks/sampling_overhead.py --size qm9 --latent-dim 32 --steps 128   # VADD+CP / VADD+TT vs VADD
    python benchmarks/sampling_overhead.py --size qm9 --tt-rank 8 16 --steps 128 --quick   # TT ranks vs rank 1

One randomly initialized backbone per size; rank-1, CP and TT heads are built from it exactly as
fine-tuning does (heads with noise, so the joints are not degenerate). For each setting it times the
full generation of a batch (best of ``--reps``, interleaved across the three models) and prints
seconds per sample and the ratio to rank 1. Models are served as in bf16 (``prepare_for_inference``).
QM9-sized: l = 32, v = 40, 1-layer heads (CP r = 64, TT r = 8), as the paper's QM9 setup.
Text-sized: l = 128, v = 8192, 2-layer heads (CP r = 16, TT r = 4), as the paper's text setup.
Adaptive orderings and EB-Sampler run the chain rule over full V x r x r cores on every masked
position; at text size that costs several times rank 1, so ``--text-adaptive`` opts in to time them.
The ``fast`` rows are the fast adaptive path (``adaptive_path="fast"``: a cheap marginal pass per step, then
a joint draw of the chosen set; ``ttcore.sampling.steps.fast_adaptive``); they run at every size, and each
cell also gives ``/rnd``: its time per model call over the same model's random order at the same K (the
issue's "cost of a random-order step").
"""

import argparse
import time

import torch

from ttcore.models import DiTConfig, JointModel, ModelConfig, prepare_for_inference
from ttcore.sampling import generate

SIZES = {
    "qm9": dict(length=32, vocab=40, hidden=256, blocks=6, heads=8, batch=64, head="1layer", cp=64, tt=8),
    "smoke": dict(length=8, vocab=6, hidden=32, blocks=1, heads=2, batch=2, head="1layer", cp=2, tt=2),
    "text": dict(length=128, vocab=8192, hidden=256, blocks=6, heads=8, batch=8, head="2layer", cp=16, tt=4),
}


def _models(size: dict, latent_dim: int = 0, tt_ranks: list[int] | None = None) -> dict:
    torch.manual_seed(0)
    cfg = ModelConfig(DiTConfig(vocab_size=size["vocab"] + 1, out_vocab=size["vocab"], length=size["length"],
                                hidden_dim=size["hidden"], n_blocks=size["blocks"], n_heads=size["heads"],
                                latent_dim=latent_dim))
    base = JointModel(cfg)
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.02 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    models = {"rank1": base}
    if not tt_ranks:
        models[f"cp{size['cp']}"] = JointModel.from_base(base, "cp", size["cp"], size["head"], 0.1, g)
    for r in tt_ranks or [size["tt"]]:
        models[f"tt{r}"] = JointModel.from_base(base, "tt", r, size["head"], 0.1, g)
    return {name: prepare_for_inference(m, "bf16") for name, m in models.items()}  # as served in bf16


def _seconds_per_sample(models: dict, n: int, steps: int, reps: int, **settings) -> dict:
    """Best time per sample of each model; the reps are interleaved across the models, so a slow
    spell of the machine hits all of them alike. -> {name: (seconds per sample, model calls)}."""
    for model in models.values():  # warm-up (allocator, kernels)
        with model.compute_context():
            list(generate(model, n, min(steps, 2), seed=0, **settings))
    best = {name: (float("inf"), 0) for name in models}
    for rep in range(reps):
        for name, model in models.items():
            t0 = time.perf_counter()
            with model.compute_context():
                *_, last = generate(model, n, steps, seed=rep, **settings)
            best[name] = (min(best[name][0], (time.perf_counter() - t0) / n), last.model_calls)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--size", choices=sorted(SIZES), help="only this model size")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--text-adaptive", action="store_true", help="also time top_prob and EB at text size (slow)")
    ap.add_argument("--latent-dim", type=int, default=0,
                    help="VADD backbones with a latent of this size (Sec. 4.4): the ratios are then to VADD")
    ap.add_argument("--steps", type=int, nargs="*", help="only these step counts")
    ap.add_argument("--tt-rank", type=int, nargs="*", help="TT at these ranks (instead of the size's CP and TT)")
    args = ap.parse_args()
    sizes = [args.size] if args.size else ["qm9"] if args.quick else ["qm9", "text"]
    settings = [("random", dict(ordering="random")), ("top_prob", dict(ordering="top_prob", adaptive_path="exact")),
                ("eb g=0.5", dict(eb_gamma=0.5, adaptive_path="exact"))]
    settings += [(f"{o} fast", dict(ordering=o, adaptive_path="fast")) for o in ("top_prob", "margin", "entropy")]
    settings += [(f"eb fast g={g}", dict(eb_gamma=g, adaptive_path="fast")) for g in (0.1, 0.5, 1.0)]
    steps_list = [2, 4] if args.size == "smoke" else [8, 32] if args.quick else [8, 32, 128]
    steps_list = args.steps or steps_list
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, bf16 autocast backbone, "
          f"best of {args.reps}; s/sample (model calls) and ratio to {'VADD' if args.latent_dim else 'rank 1'}")
    for name in sizes:
        size = SIZES[name]
        models = _models(size, args.latent_dim, args.tt_rank)
        if args.latent_dim:  # the same timings, named for what they are: VADD, VADD+CP, VADD+TT
            models = {("vadd" if k == "rank1" else f"vadd+{k}"): m for k, m in models.items()}
        kind = f" VADD (latent {args.latent_dim})" if args.latent_dim else ""
        print(f"\n{name}{kind}: l = {size['length']}, v = {size['vocab']}, "
              f"d = {size['hidden']} x {size['blocks']} blocks, batch {size['batch']}, {size['head']} heads")
        head = f"{'setting':>16} {'K':>4} | " + " | ".join(f"{m:>31}" for m in models)
        print(head + "\n" + "-" * len(head))
        random_per_call = {}  # (model, K) -> seconds per sample per model call of random order
        for label, kw in settings:
            if name == "text" and label in ("top_prob", "eb g=0.5") and not args.text_adaptive:
                continue  # the exact chain rule at text size: minutes
            for steps in steps_list if not label.startswith("eb") else [steps_list[-1]]:
                times = _seconds_per_sample(models, size["batch"], steps, args.reps, **kw)
                base = times["vadd" if args.latent_dim else "rank1"][0]
                if label == "random":
                    random_per_call.update({(m, steps): s / calls for m, (s, calls) in times.items()})
                cells = []
                for m, (s, calls) in times.items():
                    cell = f"{s * 1e3:8.2f} ms ({calls:3d}) x{s / base:4.2f}"
                    if "fast" in label:  # per model call against random order at the largest K timed
                        ref = random_per_call.get((m, steps)) or random_per_call.get((m, steps_list[-1]))
                        cell += f" /rnd {s / calls / ref:4.2f}" if ref else ""
                    cells.append(cell)
                print(f"{label:>16} {steps:>4} | " + " | ".join(f"{c:>31}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
