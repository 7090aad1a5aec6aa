"""Pretrain a base (rank-1) masked diffusion model, MDLM-style, or VADD-style with a latent (Sec. 4.4).

    python training/pretrain.py --config qm9 --out runs/qm9-base --max-minutes 150 --resume
    python training/pretrain.py --config tiny --data tests/data/qm9_sample.txt --out runs/tiny --max-steps 50
    python training/pretrain.py --config text --out runs/text-base --max-minutes 120 --resume
    python training/pretrain.py --config text --tokenizer runs/text-base --out runs/text-base-2   # same vocabulary
    python training/pretrain.py --config qm9 --latent vadd --latent-dim 32 --out runs/qm9-vadd --resume
"""

from _common import config_from_args, new_or_resumed, parser, report
from _loop import fit


def main():
    ap = parser(__doc__)
    ap.add_argument("--tokenizer", help="a directory holding the tokenizer.json to use (a checkpoint's), "
                                        "instead of building one from the data")
    ap.add_argument("--latent", choices=["none", "vadd"], default="none",
                    help="vadd: a Gaussian latent z in the denoiser and a recognition network, trained with Eq. 21")
    ap.add_argument("--latent-dim", type=int, default=32, help="with --latent vadd: the dimension of z")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.latent_dim": args.latent_dim if args.latent == "vadd" else None})
    model, tokenizer, train, val, resuming = new_or_resumed(args, cfg)
    title = f"{cfg.data.family} base {'VADD' if model.latent_dim else 'MDM'} (rank 1)"
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=title, quiet=args.quiet, fit_minutes=args.fit_minutes)
    report(args, meta)


if __name__ == "__main__":
    main()
