"""Seeded golden outputs: samples of every format x ordering x sampler, batched steps, losses, and a
bundled checkpoint under bf16. Recorded once before a refactor and compared bit for bit after it by
``tests/test_golden.py``: behaviour-preserving changes keep them. To record (the helpers on the path as
pytest puts them):

    PYTHONPATH=tests/sampling python tests/golden/record.py
"""

import json
from pathlib import Path

import torch
from tiny import run_together, tiny_model

from ttcore.losses import mdlm_loss
from ttcore.models import load_for_inference
from ttcore.sampling import generate, make_run

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

GOLDEN = HERE / "samples.json"
V, L, R = 5, 6, 3
EXACT = dict(adaptive_path="exact")  # adaptive orderings and EB by the chain rule (recorded when it was the default)
CASES = [  # (name, settings)
    *[(f"{o}", dict(ordering=o)) for o in ("random", "left_to_right", "halton")],
    *[(f"{o}", dict(ordering=o, **EXACT)) for o in ("top_prob", "margin", "entropy")],
    *[(f"eb-{p}", dict(eb_gamma=0.7, eb_proxy=p, **EXACT)) for p in ("entropy", "confidence", "margin")],
    ("exact-contraction", dict(contraction="exact")),
    ("temperature", dict(temperature=0.8, ordering="halton")),
    ("cosine-bernoulli", dict(schedule="cosine", bernoulli=True)),
    ("prompt", dict(prompt=torch.tensor([1, V, 2, V, V, 0]))),
]


def _tokens(model, steps=3, n=3, seed=7, **settings) -> list:
    *_, last = generate(model, n, steps, seed=seed, **settings)
    return last.tokens.tolist()


def outputs() -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for fmt in ("none", "cp", "tt"):
            model = tiny_model(fmt, V, L, R, perturb=1.0, noise=1.0)
            for name, settings in CASES:
                out[f"{fmt}/{name}"] = _tokens(model, **settings)
            runs = [make_run(model, 2, 3, seed=s, ordering=o, **EXACT) for s, o in ((1, "random"), (2, "halton"),
                                                                                         (3, "entropy"))]
            out[f"{fmt}/batched"] = [state.tokens.tolist() for state in run_together(model, runs)]
            g = torch.Generator().manual_seed(5)
            x0 = torch.randint(0, V, (8, L), generator=g)
            losses = mdlm_loss(tiny_model(fmt, V, L, R, perturb=0.2, noise=0.2).train(), x0, V, generator=g)
            out[f"{fmt}/loss"] = {k: float(v.detach()) for k, v in sorted(losses.items())}
        model, tok, _ = load_for_inference(ROOT / "checkpoints" / "qm9-tt-r16", "cpu", "bf16")
        with model.compute_context():
            out["qm9-tt-r16/bf16"] = _tokens(model, steps=4, n=4, seed=3)
        return out
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(outputs()) + "\n")
    print(f"wrote {GOLDEN}")
