"""Train a family's autoregressive model (``ttcore.kinds.autoregressive``): the DiT's width and depth with causal
attention, the same tokenizer, data section and loop as ``pretrain.py``, fitted by maximum likelihood, -log p(x)
per token.

    python training/train_ar.py --config qm9 --out runs/qm9-ar --max-minutes 150 --resume
    python training/train_ar.py --config tiny --data tests/data/qm9_sample.txt --out runs/tiny-ar --max-steps 50
    python training/train_ar.py --config text --tokenizer checkpoints/text-tt-r4 --out runs/text-ar --resume
"""

from _common import config_from_args, new_or_resumed, parser, report
from _loop import fit

from ttcore.kinds.autoregressive import ar_loss


def main():
    ap = parser(__doc__)
    ap.add_argument("--tokenizer", help="a directory holding the tokenizer.json to use (a checkpoint's: the AR model "
                                        "then shares the diffusion model's vocabulary, as EDLM and DCD need)")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.causal": True, "model.latent_dim": 0})
    model, tokenizer, train, val, resuming = new_or_resumed(args, cfg)
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=f"{cfg.data.family} autoregressive", quiet=args.quiet,
               fit_minutes=args.fit_minutes, objective=ar_loss)
    report(args, meta)


if __name__ == "__main__":
    main()
