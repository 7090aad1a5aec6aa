"""Cost of exact joint inference against the factorized MDM, side by side in one run.

    python benchmarks/joint_sampling.py            # full grid: l in {32,128,1024}, v in {40,8192}, r in {1,4,8}
    python benchmarks/joint_sampling.py --quick    # l in {32,128}, v = 40
    python benchmarks/joint_sampling.py --smoke    # l = 8, v = 5, r in {1,2}: seconds (the tests run it)

For each (l, v, r) it times, on one sequence (b = 1, as a sampler step sees it per sample):
- log_prob of a full sequence (the training-time NLL) for CP and TT, and for Factorized;
- sample of a random l/8 subset from full cores (TT: contracts sum_x G over v first);
- TT sample of the same subset on the generation path: contracted cores given (the contracted-core
  head), and at each chosen position only the core row of the sampled hidden state (Sec. 4.3).
Ratios are to Factorized doing the same thing in the same run.
"""

import argparse
import statistics
import time

import torch

from ttcore.distributions import CP, Factorized, TensorTrain, tt_sample_path


def _time(fn, min_time, max_reps=200):
    fn()  # warm-up
    times, start = [], time.perf_counter()
    while (time.perf_counter() - start < min_time or len(times) < 3) and len(times) < max_reps:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _normalized(shape, dims, g):
    x = torch.rand(shape, generator=g)
    return x.div_(x.sum(dims, keepdim=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    min_time = 0.0 if args.smoke else 0.3  # seconds per cell (at least 3 repetitions)
    lengths, vocabs, ranks = ([32, 128, 1024], [40, 8192], [1, 4, 8])
    if args.quick:
        lengths, vocabs = [32, 128], [40]
    if args.smoke:
        lengths, vocabs, ranks = [8], [5], [1, 2]
    g = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, b = 1, |T| = l/8")
    head = (f"{'l':>5} {'v':>5} {'r':>2} {'fmt':>4} | {'log_prob ms':>11} {'x fact':>7} | {'sample ms':>9} "
            f"{'x fact':>7} | {'head path ms':>12} {'x fact':>7}")
    print(head)
    print("-" * len(head))
    for l in lengths:
        for v in vocabs:
            x = torch.randint(0, v, (1, l), generator=g)
            positions = torch.zeros(1, l, dtype=torch.bool)
            positions[0, torch.randperm(l, generator=g)[: max(1, l // 8)]] = True
            fact = Factorized(_normalized((1, l, v), -1, g), validate=False)
            f_lp = _time(lambda: fact.log_prob(x), min_time)
            f_s = _time(lambda: fact.sample(positions, g), min_time)
            print(f"{l:>5} {v:>5} {1:>2} {'fact':>4} | {f_lp * 1e3:>11.3f} {1:>7.2f} | {f_s * 1e3:>9.3f} {1:>7.2f} |")
            for r in ranks:
                cp = CP(_normalized((1, r), -1, g), _normalized((1, l, r, v), -1, g), validate=False)
                lp, s = _time(lambda: cp.log_prob(x), min_time), _time(lambda: cp.sample(positions, g), min_time)
                print(f"{l:>5} {v:>5} {r:>2} {'cp':>4} | {lp * 1e3:>11.3f} {lp / f_lp:>7.2f} | {s * 1e3:>9.3f} "
                      f"{s / f_s:>7.2f} |")
                cp = None  # free it before the TT of the same size
                cores = _normalized((1, l, v, r, r), (2, 4), g)
                tt = TensorTrain(cores, validate=False)
                lp, s = _time(lambda: tt.log_prob(x), min_time), _time(lambda: tt.sample(positions, g), min_time, 20)
                contracted = tt.contracted()
                rows = lambda n, t, j: cores[n, t, :, j, :]  # noqa: E731
                hp = _time(lambda: tt_sample_path(contracted, positions, rows, g), min_time)
                print(f"{l:>5} {v:>5} {r:>2} {'tt':>4} | {lp * 1e3:>11.3f} {lp / f_lp:>7.2f} | {s * 1e3:>9.3f} "
                      f"{s / f_s:>7.2f} | {hp * 1e3:>12.3f} {hp / f_s:>7.2f}")
                tt = cores = contracted = None


if __name__ == "__main__":
    main()
