"""How far the fast adaptive step's chooser is from the marginals it stands for, by c (the head outputs it
evaluates per masked position), on served checkpoints, beside its cost against a random-order step.

    python benchmarks/chooser_distance.py                                  # the bundled CP / TT checkpoints
    python benchmarks/chooser_distance.py --checkpoints checkpoints/text-tt-r4 --sequences 8
    python benchmarks/chooser_distance.py --smoke                          # a tiny random TT (the tests run it)

States: sequences the checkpoint samples itself (random order, K = l, seed 0), each masked at t = 0.25, 0.5,
0.75 and 1 (the states a generation passes through). For each masked position: the total variation (TV)
between the chooser's distribution (``chooser_marginals`` at c) and the exact single-position marginal
p(x^i | x_t) of the checkpoint's joint (CP: Eqs. 14-15 with every component; TT: Eqs. 16-17 with every
masked position's cores summed, the tempered TT of Eq. 9), at the temperatures asked. Mean, 95th percentile
and max over positions. "step cost" is a fast step's time (forward, chooser, joint draw) over a random-order
step's (forward, joint draw) on the same batch at K = 16, best of 3 each, bf16 as served.
"""

import argparse
import time
from pathlib import Path

import torch

from ttcore.models import DiTConfig, JointModel, ModelConfig, load_for_inference, prepare_for_inference
from ttcore.sampling import generate
from ttcore.sampling.generate import features
from ttcore.sampling.joint_step import predetermined_step
from ttcore.sampling.orderings import top_k_mask
from ttcore.sampling.steps.fast_adaptive import chooser_marginals, chooser_outputs

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ["qm9-cp-r64", "qm9-tt-r16", "moses-tt-r8", "text-tt-r4"]


def exact_marginals(model, h, masked, temperature) -> torch.Tensor:
    """p(x^i | x_t) at every masked position under the checkpoint's tempered joint -> [m, v] float64."""
    fmt = model.format  # the exact contraction where the format has one (TT): CP's and rank 1's are exact anyway
    contraction = "exact" if "exact" in fmt.contractions else "head"
    return fmt.marginals_at(model.head, h, masked, masked, temperature, contraction)


def _states(model, sequences: int, seed: int = 0) -> torch.Tensor:
    """The model's own samples, masked at t = 0.25, 0.5, 0.75, 1 -> [4 * sequences, l]."""
    l, mask_id = model.cfg.dit.length, model.cfg.dit.mask_id
    with model.compute_context():
        *_, last = generate(model, sequences, l, seed=seed)
    x0 = last.tokens
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in (0.25, 0.5, 0.75, 1.0):
        mask = torch.rand(x0.shape, generator=g) < t
        out.append(torch.where(mask, mask_id, x0))
    return torch.cat(out)


def _best(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(name: str, model, sequences: int, temperatures: list[float], cs: list[int] | None) -> list[str]:
    x = _states(model, sequences)
    mask_id = model.cfg.dit.mask_id
    masked = x == mask_id
    e = model.format.outputs_per_position(model.cfg.rank)
    v = model.cfg.dit.out_vocab
    default = chooser_outputs(e, v)
    cs = sorted({c for c in (cs or [1, 2, 4, 8, 16, 32, 64, 128, 256]) if c <= e} | {default, e})
    rows = []
    with model.compute_context():
        h = features(model, x, None)
        forward_s = _best(lambda: features(model, x, None))
        counts = torch.clamp(masked.sum(1) // 16, min=1)  # K = 16 for the cost reference
        chosen = top_k_mask(torch.rand(x.shape, generator=torch.Generator().manual_seed(1)), masked, counts)
        g = torch.Generator().manual_seed(2)
        dec = model.format
        for temperature in temperatures:
            # the reference: a random-order step at the same temperature (at T != 1 a TT step sums its cores too)
            draw_s = _best(lambda: predetermined_step(model, h, x, masked, chosen, temperature, g, "head"))
            exact = exact_marginals(model, h, masked, temperature)
            exact_chooser = dec.sums_exactly("head", temperature, True, False)  # c plays no part then
            for c in [e] if exact_chooser else cs:
                got = chooser_marginals(model, h, masked, temperature, outputs=c).double()
                tv = 0.5 * (got - exact).abs().sum(-1)
                chooser_s = _best(lambda: chooser_marginals(model, h, masked, temperature, outputs=c))
                cost = (forward_s + chooser_s + draw_s) / (forward_s + draw_s)
                label = "exact" if exact_chooser else f"{c:>4d}{'*' if c == default else ' '}"
                rows.append(f"{name:>14} {temperature:>4g} {label:>5}{e:>5d} | "
                            f"{tv.mean().item():>7.4f} {tv.quantile(0.95).item():>7.4f} {tv.max().item():>7.4f} | "
                            f"{cost:>8.2f}x")
    return rows


def _smoke_model():
    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig(vocab_size=7, out_vocab=6, length=8, hidden_dim=32, cond_dim=16,
                                            n_blocks=1, n_heads=2)))
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return prepare_for_inference(JointModel.from_base(base, "tt", 3, noise=0.3), "bf16")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", nargs="*", default=[str(ROOT / "checkpoints" / n) for n in BUNDLED])
    ap.add_argument("--sequences", type=int, default=16, help="samples per checkpoint (each masked at 4 times)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    ap.add_argument("--outputs", type=int, nargs="*", help="the c values (default: powers of 2 up to E)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    models = {"smoke-tt3": _smoke_model()} if args.smoke else {
        Path(p).name: load_for_inference(p, "cpu", "bf16")[0] for p in args.checkpoints}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, bf16; TV to the exact marginal over "
          f"masked positions ('*': the served c = {2048} // V)")
    print(f"{'checkpoint':>14} {'T':>4} {'c':>5}{'E':>5} | {'TV mean':>7} {'p95':>7} {'max':>7} | {'step cost':>9}")
    for name, model in models.items():
        for row in measure(name, model, 2 if args.smoke else args.sequences, args.temperatures, args.outputs):
            print(row, flush=True)


if __name__ == "__main__":
    main()
