"""Pretrain a base (rank-1) masked diffusion model, MDLM-style, or VADD-style with a latent (Sec. 4.4).

    python training/pretrain.py --config qm9 --out runs/qm9-base --max-minutes 150 --resume
    python training/pretrain.py --config tiny --data tests/data/qm9_sample.txt --out runs/tiny --max-steps 50
    python training/pretrain.py --config text --out runs/text-base --max-minutes 120 --resume
    python training/pretrain.py --config text --tokenizer runs/text-base --out runs/text-base-2   # same vocabulary
    python training/pretrain.py --config qm9 --latent vadd --latent-dim 32 --out runs/qm9-vadd --resume
"""

from pathlib import Path

import torch
from _common import config_from_args, dataset, parser, tensors
from _loop import fit

from ttcore.models import JointModel, ModelConfig, load_checkpoint, load_train_state
from ttcore.parallel import is_main_process
from ttcore.recipes import throughput_line
from ttcore.tokenizers import load_tokenizer


def main():
    ap = parser(__doc__)
    ap.add_argument("--tokenizer", help="a directory holding the tokenizer.json to use (a checkpoint's), "
                                        "instead of building one from the data")
    ap.add_argument("--latent", choices=["none", "vadd"], default="none",
                    help="vadd: a Gaussian latent z in the denoiser and a recognition network, trained with Eq. 21")
    ap.add_argument("--latent-dim", type=int, default=32, help="with --latent vadd: the dimension of z")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.latent_dim": args.latent_dim if args.latent == "vadd" else None})
    resuming = args.resume and Path(args.out).exists() and load_train_state(args.out) is not None
    if resuming:
        model, tokenizer, _ = load_checkpoint(args.out)
        ds = dataset(cfg, tokenizer)
    else:
        ds = dataset(cfg, load_tokenizer(args.tokenizer) if args.tokenizer else None)
        tokenizer = ds.tokenizer
        torch.manual_seed(cfg.seed)  # the initialization is part of the run's seed
        model = JointModel(ModelConfig(cfg.model.dit_config(tokenizer), extra=cfg.data.model_extra()))
    train, val = tensors(ds)
    title = f"{cfg.data.family} base {'VADD' if model.latent_dim else 'MDM'} (rank 1)"
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=title, quiet=args.quiet, fit_minutes=args.fit_minutes)
    if is_main_process():
        print(f"wrote {args.out}: step {meta['step']}, val {meta['val']}, {meta['seconds_per_step']:.3f} s/step, "
              f"peak RSS {meta['peak_rss_mb']:.0f} MB")
        if meta.get("throughput"):
            print(throughput_line(meta["throughput"])[2:])


if __name__ == "__main__":
    main()
