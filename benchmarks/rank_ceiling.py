"""What one step can draw at most, by TT rank: the K = 1 ceiling of a TT joint on a family's data.

From the fully masked state a model's x_t says nothing about the sample, so its one-step joint is one TT (Eq. 9)
shared by every sample: a rank-r model's K = 1 draw is a draw of some rank-r TT over the whole sequence. Here, for
each rank, a free TT (cores [l, v, r, r] with Eq. 10's row normalization, no backbone) is fitted by exact maximum
likelihood (``tt_shared_log_prob``) to the family's training sequences with Adam, and sampled exactly
(``TensorTrain.sample``). It prints the held-out -log p(x) per position (exact for the fitted TT; an optimizer's
fit, so an estimate of the rank's best from above) and, for molecules, the validity / uniqueness of 1,024 samples:
the one-step quality a joint head of that rank can reach when its fit is as good as this one's. A distilled
student of its teacher's rank inherits the teacher rank's ceiling (docs/distillation.md); a grown student
(``distill.py --student-rank``) does not.

    python benchmarks/rank_ceiling.py --checkpoint checkpoints/qm9-tt-r16 --ranks 16 64 128 --steps 1500
"""

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "training")]


def fit_free_tt(train: torch.Tensor, v: int, rank: int, steps: int, batch: int, lr: float,
                generator: torch.Generator) -> torch.Tensor:
    """A free TT's core logits [l, v, r, r] fitted to ``train`` [n, l] by Adam on the exact mean -log p(x)."""
    from ttcore.distributions import tt_cores_from_logits, tt_shared_log_prob

    logits = torch.nn.Parameter(0.01 * torch.randn(train.shape[1], v, rank, rank, generator=generator))
    opt = torch.optim.Adam([logits], lr=lr)
    for _ in range(steps):
        x = train[torch.randint(0, len(train), (batch,), generator=generator)]
        loss = -tt_shared_log_prob(tt_cores_from_logits(logits), x).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return logits.detach()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a checkpoint of the family: its tokenizer and data section")
    ap.add_argument("--data", help="another corpus or file than the checkpoint's (as evaluate.py --data)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--steps", type=int, default=1500, help="Adam steps per rank")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-2)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from _common import dataset
    from _report import data_section

    from ttcore.distributions import TensorTrain, tt_cores_from_logits, tt_shared_log_prob
    from ttcore.metrics import molecule_metrics
    from ttcore.metrics.kinds import get_metrics_kind
    from ttcore.recipes import TrainConfig
    from ttcore.tokenizers import load_tokenizer

    tok = load_tokenizer(args.checkpoint)  # the tokenizer alone: no weights are read
    section = data_section(args.data, Path(args.checkpoint))
    ds = dataset(TrainConfig(data=section), tok)
    train, val = torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens)
    v = int(max(train.max(), val.max())) + 1  # the tokens the data uses (no [MASK]: a sample has none)
    molecular = get_metrics_kind(section.metrics).molecular
    print(f"free TT fitted by exact maximum likelihood: {len(train)} training sequences of length {train.shape[1]}, "
          f"{args.steps} Adam steps of {args.batch}, lr {args.lr}; {args.samples} exact samples")
    print(f"{'rank':>5} | {'val -log p(x)/pos':>17} | {'valid %':>7} | {'unique %':>8} | {'s':>6}")
    for rank in args.ranks:
        gen = torch.Generator().manual_seed(args.seed)
        t0 = time.perf_counter()
        logits = fit_free_tt(train, v, rank, args.steps, args.batch, args.lr, gen)
        cores = tt_cores_from_logits(logits.double())
        with torch.no_grad():
            nll = -torch.cat([tt_shared_log_prob(cores, val[s:s + 4096]) for s in range(0, len(val), 4096)]).mean()
            drawn = TensorTrain(cores.expand(args.samples, -1, -1, -1, -1), validate=False).sample(generator=gen)
        seconds = time.perf_counter() - t0
        per_pos = nll.item() / train.shape[1]
        if molecular:
            m = molecule_metrics([tok.decode(row.tolist()) for row in drawn], set(ds.train))
            print(f"{rank:>5} | {per_pos:>17.4f} | {100 * m['validity']:>7.1f} | {100 * m['uniqueness']:>8.1f} | "
                  f"{seconds:>6.0f}")
        else:
            print(f"{rank:>5} | {per_pos:>17.4f} | {'-':>7} | {'-':>8} | {seconds:>6.0f}")


if __name__ == "__main__":
    main()
