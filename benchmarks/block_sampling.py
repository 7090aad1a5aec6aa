"""Block diffusion's generation cost against full-sequence diffusion at the same step count, side by side in one
run (untrained weights of one shape: the cost does not depend on them).

    python benchmarks/block_sampling.py            # l = 128, blocks of 4 and 16, TT r = 4, 64 sequences
    python benchmarks/block_sampling.py --smoke    # l = 16, blocks of 4, 4 sequences: seconds (the tests run it)
    python benchmarks/block_sampling.py --shape qm9 --samples 1 64   # QM9's b = 4 shape: l = 24, TT r = 8
    python benchmarks/block_sampling.py --shape qm9-b2 --samples 1 64   # the bundled block checkpoint's: l = 22, b = 2
    python benchmarks/block_sampling.py --shape qm9-ladder --samples 1 64   # l = 24, b = 1, 2, 4, 8, 24; k = 1, 2, b

For each block size b and steps a block k (``"b"``: one token a step) it times one generation of n sequences,
K = k l / b steps in all (b = 1 has a rank-1 head: a block of one position has no joint to factor):
- ``cached``: the batched loop the service runs (``sampler: blocks``) over the key-value cache of the committed
  blocks (``ttcore.models.block_cache``: each step the current block's b positions, 2b at a block's first);
- ``uncached``: the same loop without the cache (``kv_cache=False``: each step a forward of the blocks up to the
  current one);
- ``mdlm``: a full-sequence TT model of the same shape, K steps of the predetermined random order;
- ``ar``: an autoregressive model of the same width and depth, its l steps over its key-value cache.
Ratios are to ``mdlm`` and to ``ar`` in the same run (below 1: cheaper)."""

import argparse
import statistics
import time

import torch

from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.sampling import generate

SHAPES = {  # length, vocabulary, block sizes, TT rank, (width, layers, heads, conditioning), steps a block
    "smoke": (16, 8, [4], 2, (32, 1, 4, 64), [1, 2]),
    "default": (128, 64, [4, 16], 4, (256, 4, 4, 64), [1, 4]),
    "qm9": (24, 31, [4], 8, (256, 6, 8, 128), [1, 2, 4]),  # the QM9 block checkpoints' (training/train_blocks.py)
    "qm9-b2": (22, 31, [2], 8, (256, 6, 8, 128), [1, 2]),  # the bundled checkpoints/qm9-b2-tt-r8's
    "qm9-ladder": (24, 31, [1, 2, 4, 8, 24], 8, (256, 6, 8, 128), [1, 2, "b"]),  # the block page's block sizes
}


def _model(length, vocab, block, rank, net, causal=False):
    torch.manual_seed(0)
    hidden, layers, heads, cond = net
    dit = DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, hidden_dim=hidden, cond_dim=cond,
                    n_blocks=layers, n_heads=heads, block_size=block, causal=causal)
    rank_one = causal or block == 1
    return JointModel(ModelConfig(dit, "none" if rank_one else "tt", 1 if rank_one else rank, "1layer")).eval()


def _seconds(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="--shape smoke, 4 sequences")
    ap.add_argument("--shape", choices=list(SHAPES), default="default")
    ap.add_argument("--samples", type=int, nargs="+", help="sequences a generation, a table each (default 64)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    shape = "smoke" if args.smoke else args.shape
    length, vocab, blocks, rank, net, ks = SHAPES[shape]
    full = _model(length, vocab, 0, rank, net)
    ar = _model(length, vocab, 0, rank, net, causal=True)
    for n in args.samples or [4 if args.smoke else 64]:
        print(f"l = {length}, v = {vocab}, TT r = {rank}, d = {net[0]}, {net[1]} layers, {n} sequences; seconds a "
              f"generation (median of {args.reps}), ratios to mdlm at the same K and to ar (l steps, cached)")
        print(f"{'b':>4} {'k':>3} {'K':>5} | {'cached':>8} {'uncached':>8} {'mdlm':>8} {'ar':>8} | "
              f"{'cached/mdlm':>11} {'uncached/mdlm':>13} {'cached/ar':>9}")
        with torch.inference_mode():
            ar_s = _seconds(lambda: list(generate(ar, n, length, seed=0, ordering="left_to_right")), args.reps)
            for b in blocks:
                model = _model(length, vocab, b, rank, net)
                for k in sorted({b if k == "b" else k for k in ks}):
                    if k > b:
                        continue
                    steps = k * length // b
                    cached = _seconds(lambda: list(generate(model, n, steps, seed=0, sampler="blocks")), args.reps)
                    uncached = _seconds(lambda: list(generate(model, n, steps, seed=0, sampler="blocks",
                                                              kv_cache=False)), args.reps)
                    mdlm = _seconds(lambda: list(generate(full, n, steps, seed=0)), args.reps)
                    print(f"{b:>4} {k:>3} {steps:>5} | {cached:8.3f} {uncached:8.3f} {mdlm:8.3f} {ar_s:8.3f} | "
                          f"{cached / mdlm:11.2f} {uncached / mdlm:13.2f} {cached / ar_s:9.2f}")


if __name__ == "__main__":
    main()
