"""What a joint head costs through HTTP: a TT (or CP) checkpoint against the rank-1 checkpoint of the same
family, the same request to each, alternating, on a running embedded server (the service's whole path: the
engine's batched step, its host copies and the counter-based draws, which an in-process benchmark does not
see). With ``--baseline-tree`` a second server runs from another checkout and every pair is measured on both,
one after the other, in the same run.

    python benchmarks/served_overhead.py                       # QM9 TT r = 16 vs rank 1, 64 x 128 steps, 5 pairs
    git worktree add /tmp/before <commit>
    python benchmarks/served_overhead.py --baseline-tree /tmp/before
    python benchmarks/served_overhead.py --checkpoints DIR --rank 2 --samples 2 --steps 4 --pairs 1   # smoke

Prints each pair's seconds and the joint / rank-1 ratio, and the median ratio per tree.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _server import start

ROOT = Path(__file__).resolve().parent.parent


def _start(tree: Path, checkpoints: Path, precision: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    return start([sys.executable, "-m", "service", "--checkpoints", checkpoints, "--threads", "1", "--log-level",
                  "warning", "--precision", precision], cwd=tree, env=env)


def _seconds(url: str, body: dict) -> float:
    t0 = time.perf_counter()
    r = httpx.post(url + "/generate", json=body, timeout=600)
    if r.status_code != 200:
        raise SystemExit(f"{body}: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", type=Path, default=None, help="default: each tree's checkpoints/")
    ap.add_argument("--baseline-tree", type=Path, help="another checkout, served and measured alongside")
    ap.add_argument("--model", default="qm9")
    ap.add_argument("--decomposition", default="tt", choices=["tt", "cp"])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--ordering", default="random")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--precision", default="bf16")
    args = ap.parse_args()
    trees = {"this tree": ROOT} | ({"baseline": args.baseline_tree.resolve()} if args.baseline_tree else {})
    common = dict(model=args.model, num_samples=args.samples, steps=args.steps, ordering=args.ordering, seed=0)
    joint = dict(common, decomposition=args.decomposition, rank=args.rank)
    base = dict(common, decomposition="none", rank=1)
    servers = {name: _start(tree, args.checkpoints or tree / "checkpoints", args.precision)
               for name, tree in trees.items()}
    try:
        for _, url in servers.values():  # warm-up: each kind of work is timed on first use
            _seconds(url, joint), _seconds(url, base)
        label = f"{args.decomposition} r={args.rank}"
        print(f"{args.model}: {label} vs rank 1, {args.samples} samples x {args.steps} steps, {args.ordering} order, "
              f"{args.precision}, alternating pairs")
        print(f"{'tree':>10} {'pair':>4} | {label + ' s':>10} {'rank 1 s':>9} | {'ratio':>6}")
        ratios = {name: [] for name in servers}
        for k in range(args.pairs):
            for name, (_, url) in servers.items():
                a, b = _seconds(url, joint), _seconds(url, base)
                ratios[name].append(a / b)
                print(f"{name:>10} {k:>4} | {a:>10.3f} {b:>9.3f} | {a / b:>5.3f}x", flush=True)
        for name, r in ratios.items():
            print(f"{name}: median {label} / rank 1 = {statistics.median(r):.3f}x over {len(r)} pairs")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
