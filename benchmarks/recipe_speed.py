"""The training recipe's speed against another checkout's, side by side: ``training/pretrain.py`` as a user runs
it, from this tree and from ``--baseline-tree`` (a ``git worktree`` of an older commit), on the same data,
model and batch, alternating, in one run.

    git worktree add /tmp/e747 e747f49
    python benchmarks/recipe_speed.py --baseline-tree /tmp/e747          # presets s and m, batch 32, 4 rounds
    python benchmarks/recipe_speed.py --baseline-tree . --smoke                    # a 1-block toy (the tests)

Each cell is a difference of two whole runs of the recipe, ``--steps`` and ``2 x --steps`` optimizer steps
(no validation or checkpoint inside either, one validation batch at the end of both): (t_long - t_short) /
steps is the seconds per step of the loop with the fixed costs (start-up, data, the MFU peak's measurement,
the last validation and checkpoint) subtracted. The model's sizes are given as explicit dimensions, so a tree
from before the ``model.size`` presets trains the same model. Data: the first ``--molecules`` MOSES training
molecules (molsets' file) as a file of sequences, or ``--data FILE``. Prints seconds per step and tokens/s
of both trees per size and round, and this tree's time over the baseline's (the median over rounds).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ttcore.recipes import MODEL_SIZES  # noqa: E402

SMOKE = dict(hidden_dim=32, cond_dim=16, n_blocks=1, n_heads=2)


def run_recipe(tree: Path, data: Path, dims: dict, batch: int, steps: int, threads: int, work: Path) -> float:
    """Wall seconds of one ``pretrain.py`` run of ``steps`` steps from ``tree`` (its own code on PYTHONPATH)."""
    out = work / f"run-{time.monotonic_ns()}"
    sets = [f"model.{k}={v}" for k, v in dims.items()] + [
        f"batch_size={batch}", "val_every=1000000", "val_batches=1", "ckpt_minutes=100000", "log_every=1000000",
        "compile=false", "warmup_steps=1", "ema_decay=0", f"threads={threads}"]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(threads), TTCORE_CACHE=str(work / "cache"))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(tree / "training" / "pretrain.py"), "--config", "moses", "--data",
                           str(data), "--out", str(out), "--max-steps", str(steps), "--quiet", "--set", *sets],
                          cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{tree}: pretrain.py failed:\n{done.stderr[-3000:]}")
    return seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-tree", required=True, help="another checkout (git worktree) run side by side")
    ap.add_argument("--sizes", nargs="+", default=["s", "m"], choices=list(MODEL_SIZES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="the short run's steps; the long run takes twice as many")
    ap.add_argument("--rounds", type=int, default=4, help="each tree goes first in half of them")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--molecules", type=int, default=20000)
    ap.add_argument("--data", help="a file of sequences (default: the first --molecules of MOSES's training split)")
    ap.add_argument("--smoke", action="store_true", help="a 1-block toy, 2 + 4 steps, one round")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.steps, args.rounds, args.batch, args.molecules = ["smoke"], 2, 1, 8, 500
    trees = [("this tree", ROOT), ("baseline", Path(args.baseline_tree).resolve())]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = Path(args.data) if args.data else work / "moses.smi"
        if not args.data:
            from ttcore.data import moses_files, read_sequences
            data.write_text("\n".join(read_sequences(moses_files()["train"])[: args.molecules]) + "\n")
        length = 54  # MOSES's, the config's padded length
        print(f"pretrain.py --config moses --data {data.name}: batch {args.batch} x {length}, eager, "
              f"{args.threads} threads; seconds per step from runs of {args.steps} and {2 * args.steps} steps")
        print(f"this tree {ROOT}\nbaseline  {trees[1][1]}\n")
        print(f"{'size':>5} {'round':>5} | {'tree':>9} {'s/step':>8} {'tokens/s':>10}")
        summary = []
        for size in args.sizes:
            dims = SMOKE if size == "smoke" else MODEL_SIZES[size]
            per = {name: [] for name, _ in trees}
            for _, tree in trees:  # untimed: the first run of a size pays the page cache, imports and allocator
                run_recipe(tree, data, dims, args.batch, 1, args.threads, work)
            for r in range(args.rounds):
                for name, tree in (trees if r % 2 == 0 else trees[::-1]):  # alternate who goes first
                    short = run_recipe(tree, data, dims, args.batch, args.steps, args.threads, work)
                    long = run_recipe(tree, data, dims, args.batch, 2 * args.steps, args.threads, work)
                    per_step = max(long - short, 1e-9) / args.steps
                    per[name].append(per_step)
                    print(f"{size:>5} {r:>5} | {name:>9} {per_step:8.3f} {args.batch * length / per_step:10,.0f}",
                          flush=True)
            ratio = statistics.median(per["this tree"]) / statistics.median(per["baseline"])
            summary.append(f"{size:>5}: this tree's seconds per step / the baseline's = {ratio:.2f}x "
                           f"(median of {args.rounds} rounds)")
        print("\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
