"""Train a family's block diffusion model (``ttcore.kinds.block_diffusion``, BD3-LM): the DiT with block-causal
attention over blocks of ``--block-size`` tokens (``model.block_size``), the same tokenizer, data section and loop
as ``pretrain.py``, fitted by BD3-LM's objective (every block masked at its own time, given the clean blocks
before it, all blocks in one pass: ``ttcore.losses.block_diffusion_loss``). Validation reports its exact NLL
(``ttcore.sampling.blocks.block_log_prob``). A joint head (CP / TT) over each block: ``finetune.py`` on its
checkpoint, which keeps the kind and its objective.

``--base`` starts from a full-sequence masked diffusion checkpoint instead (BD3-LM's start from an MDLM), or from
an autoregressive one (SDAR's start: its inputs stay shifted right, ``DiTConfig.causal``, so b = 1 is that model):
its weights, head and tokenizer, its attention made block-causal; a length that ``--block-size`` does not divide is
padded up to a multiple of it (tokenizers that pad, as SMILES'), the other model settings are the base's.

    python training/train_blocks.py --config qm9 --block-size 4 --out runs/qm9-blocks4 --max-minutes 150 --resume
    python training/train_blocks.py --config qm9_finetune --base checkpoints/qm9-none-r1 --block-size 2 \
        --out runs/qm9-b2-from-mdlm --max-steps 300 --resume
    python training/train_blocks.py --config qm9_finetune --base runs/qm9-ar-from-mdlm --block-size 4 \
        --out runs/qm9-b4-from-ar --max-steps 0
    python training/train_blocks.py --config tiny --data tests/data/qm9_sample.txt --block-size 2 --out runs/tiny-b2
"""

from _common import config_from_args, dataset, finds_train_state, new_or_resumed, parser, report, tensors
from _loop import fit

from ttcore.models import load_checkpoint


def from_base(args, cfg):
    """``--base``'s model as a block diffusion model of blocks of ``--block-size`` (``JointModel.as_blocks``), its
    tokenizer padded to the model's length, and the data encoded with it -> (model, tokenizer, train, val)."""
    base, tokenizer, _ = load_checkpoint(args.base)
    length = -(-tokenizer.length // args.block_size) * args.block_size
    if length != tokenizer.length and not getattr(tokenizer, "pads", False):
        raise SystemExit(f"--block-size {args.block_size} does not divide the base's length {tokenizer.length}, and "
                         f"its tokenizer does not pad: take a block size that divides it")
    try:
        model = base.as_blocks(args.block_size, length)
    except ValueError as e:
        raise SystemExit(f"--base {args.base}: {e}") from None
    tokenizer.length = cfg.data.length = length  # the run's config says the length it trained at
    return (model, tokenizer, *tensors(dataset(cfg, tokenizer)))


def main():
    ap = parser(__doc__)
    ap.add_argument("--block-size", type=int, default=4,
                    help="tokens per block (must divide the tokenizer's length; 1: autoregressive over tokens)")
    ap.add_argument("--tokenizer", help="a directory holding the tokenizer.json to use (a checkpoint's: the model "
                                        "then shares that checkpoint's vocabulary)")
    ap.add_argument("--base", help="a full-sequence masked diffusion or an autoregressive checkpoint to start from "
                                   "(its weights, head and tokenizer)")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.block_size": args.block_size, "model.latent_dim": 0})
    if args.base and not finds_train_state(args):
        (model, tokenizer, train, val), resumed = from_base(args, cfg), False
    else:
        model, tokenizer, train, val, resumed = new_or_resumed(args, cfg)
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resumed, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=f"{cfg.data.family} block diffusion (b = {args.block_size})",
               quiet=args.quiet, fit_minutes=args.fit_minutes)
    report(args, meta)


if __name__ == "__main__":
    main()
