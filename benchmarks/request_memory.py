"""Peak memory of one request, measured beside admission's estimate (``ttcore.sampling.cost``).

Each case runs in a fresh process: load the checkpoint for inference (bf16), warm up with one tiny
request, then run the case and report the growth of peak RSS. The estimate is what the service admits
by: the bytes of one step for the sequences of one pass (micro-batched to ``--budget-mb`` as the server
does). ``measured / estimated`` must stay below 1 for the budget to hold.

    python benchmarks/request_memory.py                      # the bundled checkpoints (a few minutes)
    python benchmarks/request_memory.py --smoke              # QM9 only, small cases (the test)
    python benchmarks/request_memory.py --path fast          # the fast adaptive path's cases only
"""

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [  # checkpoint, sequences, steps, ordering, contraction[, joint[, adaptive_path]]
    ("qm9-tt-r16", 64, 8, "top_prob", "head"), ("qm9-cp-r64", 64, 8, "top_prob", "head"),
    ("qm9-none-r1", 64, 8, "top_prob", "head"), ("qm9-tt-r16", 256, 1, "random", "exact"),
    ("text-tt-r4", 1, 8, "top_prob", "head"), ("text-tt-r4", 4, 2, "top_prob", "head"),
    ("text-tt-r4", 16, 1, "top_prob", "head"),  # two passes at the default 2 GB budget
    ("text-tt-r4", 8, 4, "random", "exact"), ("text-tt-r4", 256, 1, "random", "head"),
    ("text-tt-r4", 64, 1, "random", "head", False),  # the rank-1 view: every position chosen at once
    ("text-tt-r4", 1, 8, "top_prob", "head", True, "fast"), ("text-tt-r4", 16, 1, "top_prob", "head", True, "fast"),
]
SMOKE = [("qm9-tt-r16", 16, 4, "top_prob", "head"), ("qm9-tt-r16", 16, 2, "random", "exact"),
         ("qm9-tt-r16", 16, 2, "random", "head", False), ("qm9-tt-r16", 16, 4, "top_prob", "head", True, "fast")]


def one_case(path: str, n: int, steps: int, ordering: str, contraction: str, joint: bool, adaptive_path: str,
             budget_mb: int) -> dict:
    from ttcore.models import load_for_inference
    from ttcore.sampling import cost, generate, make_run

    model, _, _ = load_for_inference(path, "cpu", "bf16")
    with model.compute_context():
        list(generate(model, 1, 1, seed=0))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    settings = dict(ordering=ordering, contraction=contraction, joint=joint, adaptive_path=adaptive_path)
    config = cost.sampler_config(**settings)
    adaptive, exact = config.step_kind(model.cfg)
    chooses = config.step.chooses
    rows = cost.rows_for(model, budget_mb << 20, **settings)
    run = make_run(model, n, steps, seed=0, max_rows_per_pass=rows if rows < n else None, **settings)
    with model.compute_context():
        while not run.done:
            run.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_pass = min(n, rows)
    estimate = (per_pass * cost.step_row_bytes(model.cfg, adaptive, chooses)
                + (cost.summed_outputs_bytes(model.cfg) if exact else 0)) / 2**20
    return {"checkpoint": Path(path).name, "sequences": n, "steps": steps, "ordering": ordering,
            "contraction": contraction, "joint": joint, "path": adaptive_path, "rows_per_pass": per_pass,
            "measured_mb": peak - base,
            "estimated_mb": estimate}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default=str(ROOT / "checkpoints"))
    ap.add_argument("--budget-mb", type=int, default=2048, help="the server's --memory-budget-mb")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--path", choices=["exact", "fast"], help="only the cases of this adaptive path")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this process
    args = ap.parse_args()
    if args.case:
        print(json.dumps(one_case(*json.loads(args.case), args.budget_mb)))
        return
    print(f"peak RSS growth of one request (bf16, fresh process each) against admission's estimate "
          f"at --memory-budget-mb {args.budget_mb}")
    print(f"{'checkpoint':>12} {'n':>4} {'K':>3} {'ordering':>9} {'contr.':>6} {'joint':>5} {'path':>5} {'pass':>5} | "
          f"{'measured MB':>11} {'estimate MB':>11} {'ratio':>6}")
    worst = 0.0
    for name, n, steps, ordering, contraction, *rest in (SMOKE if args.smoke else CASES):
        joint, path = (list(rest) + [True, "exact"][len(rest):])[:2]
        if args.path and path != args.path:
            continue
        case = json.dumps([str(Path(args.checkpoints) / name), n, steps, ordering, contraction, joint, path])
        out = subprocess.run([sys.executable, __file__, "--case", case, "--budget-mb", str(args.budget_mb)],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = r["measured_mb"] / r["estimated_mb"]
        worst = max(worst, ratio)
        print(f"{name:>12} {n:>4} {steps:>3} {ordering:>9} {contraction:>6} {str(joint).lower():>5} {path:>5} "
              f"{r['rows_per_pass']:>5} | "
              f"{r['measured_mb']:>11.0f} {r['estimated_mb']:>11.0f} {ratio:>6.2f}", flush=True)
    print(f"largest measured / estimated: {worst:.2f} (below 1: the estimate bounds what was measured)")


if __name__ == "__main__":
    main()
