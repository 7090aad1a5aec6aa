"""Train a family's block diffusion model (``ttcore.kinds.block_diffusion``, BD3-LM): the DiT with block-causal
attention over blocks of ``--block-size`` tokens (``model.block_size``), the same tokenizer, data section and loop
as ``pretrain.py``, fitted by BD3-LM's objective (every block masked at its own time, given the clean blocks
before it, all blocks in one pass: ``ttcore.losses.block_diffusion_loss``). Validation reports its exact NLL
(``ttcore.sampling.blocks.block_log_prob``). A joint head (CP / TT) over each block: ``finetune.py`` on its
checkpoint, which keeps the kind and its objective.

    python training/train_blocks.py --config qm9 --block-size 4 --out runs/qm9-blocks4 --max-minutes 150 --resume
    python training/train_blocks.py --config tiny --data tests/data/qm9_sample.txt --block-size 2 --out runs/tiny-b2
"""

from _common import config_from_args, new_or_resumed, parser, report
from _loop import fit


def main():
    ap = parser(__doc__)
    ap.add_argument("--block-size", type=int, default=4,
                    help="tokens per block (must divide the tokenizer's length; 1: autoregressive over tokens)")
    ap.add_argument("--tokenizer", help="a directory holding the tokenizer.json to use (a checkpoint's: the model "
                                        "then shares that checkpoint's vocabulary)")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.block_size": args.block_size, "model.latent_dim": 0})
    model, tokenizer, train, val, resuming = new_or_resumed(args, cfg)
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=f"{cfg.data.family} block diffusion (b = {args.block_size})",
               quiet=args.quiet, fit_minutes=args.fit_minutes)
    report(args, meta)


if __name__ == "__main__":
    main()
