"""Train a family's autoregressive model: the DiT's width and depth with causal attention (``ttcore.models.ar``),
the same tokenizer, data section and loop as ``pretrain.py``, fitted by maximum likelihood, -log p(x) per token.

    python training/train_ar.py --config qm9 --out runs/qm9-ar --max-minutes 150 --resume
    python training/train_ar.py --config tiny --data tests/data/qm9_sample.txt --out runs/tiny-ar --max-steps 50
    python training/train_ar.py --config text --tokenizer checkpoints/text-tt-r4 --out runs/text-ar --resume
"""

from pathlib import Path

import torch
from _common import config_from_args, dataset, parser, tensors
from _loop import fit

from ttcore.models import JointModel, ModelConfig, load_checkpoint, load_train_state
from ttcore.models.ar import ar_loss
from ttcore.parallel import is_main_process
from ttcore.recipes import throughput_line
from ttcore.tokenizers import load_tokenizer


def main():
    ap = parser(__doc__)
    ap.add_argument("--tokenizer", help="a directory holding the tokenizer.json to use (a checkpoint's: the AR model "
                                        "then shares the diffusion model's vocabulary, as EDLM and DCD need)")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.causal": True, "model.latent_dim": 0})
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
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=f"{cfg.data.family} autoregressive", quiet=args.quiet,
               fit_minutes=args.fit_minutes, objective=ar_loss)
    if is_main_process():
        print(f"wrote {args.out}: step {meta['step']}, val {meta['val']}, {meta['seconds_per_step']:.3f} s/step, "
              f"peak RSS {meta['peak_rss_mb']:.0f} MB")
        if meta.get("throughput"):
            print(throughput_line(meta["throughput"])[2:])


if __name__ == "__main__":
    main()
