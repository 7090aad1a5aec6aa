"""Block diffusion's generation cost against full-sequence diffusion at the same step count, side by side in one
run (untrained weights of one shape: the cost does not depend on them).

    python benchmarks/block_sampling.py            # l = 128, blocks of 4 and 16, TT r = 4, 64 sequences
    python benchmarks/block_sampling.py --smoke    # l = 16, blocks of 4, 4 sequences: seconds (the tests run it)

For each block size b and steps a block k it times one generation of n sequences, K = k l / b steps in all:
- ``cached``: ``ttcore.sampling.blocks.generate_blocks`` (each step b positions over the committed blocks' keys
  and values);
- ``loop``: the batched loop the service runs (``sampler: blocks``: each step a forward of the whole sequence);
- ``mdlm``: a full-sequence TT model of the same shape, K steps of the predetermined random order.
Ratios are to ``mdlm`` in the same run (below 1: cheaper)."""

import argparse
import statistics
import time

import torch

from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.sampling import generate
from ttcore.sampling.blocks import generate_blocks


def _model(length, vocab, block, rank, hidden, layers):
    torch.manual_seed(0)
    dit = DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, hidden_dim=hidden, cond_dim=64,
                    n_blocks=layers, n_heads=4, block_size=block)
    return JointModel(ModelConfig(dit, "tt", rank, "1layer")).eval()


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
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.smoke:
        length, vocab, blocks, rank, hidden, layers, n, ks = 16, 8, [4], 2, 32, 1, 4, [1, 2]
    else:
        length, vocab, blocks, rank, hidden, layers, n, ks = 128, 64, [4, 16], 4, 256, 4, 64, [1, 4]
    print(f"l = {length}, v = {vocab}, TT r = {rank}, d = {hidden}, {layers} layers, {n} sequences; seconds a "
          f"generation (median of {args.reps}), ratio to mdlm at the same K")
    print(f"{'b':>4} {'k':>3} {'K':>5} | {'cached':>8} {'loop':>8} {'mdlm':>8} | {'cached/mdlm':>11} {'loop/mdlm':>9}")
    full = _model(length, vocab, 0, rank, hidden, layers)
    with torch.inference_mode():
        for b in blocks:
            model = _model(length, vocab, b, rank, hidden, layers)
            for k in ks:
                if k > b:
                    continue
                steps = k * length // b
                cached = _seconds(lambda: generate_blocks(model, n, steps_per_block=k, seed=0), args.reps)
                loop = _seconds(lambda: list(generate(model, n, steps, seed=0, sampler="blocks")), args.reps)
                mdlm = _seconds(lambda: list(generate(full, n, steps, seed=0)), args.reps)
                print(f"{b:>4} {k:>3} {steps:>5} | {cached:8.3f} {loop:8.3f} {mdlm:8.3f} | {cached / mdlm:11.2f} "
                      f"{loop / mdlm:9.2f}")


if __name__ == "__main__":
    main()
