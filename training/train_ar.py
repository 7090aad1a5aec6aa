"""Train a family's autoregressive model (``ttcore.kinds.autoregressive``): the DiT's width and depth with causal
attention, the same tokenizer, data section and loop as ``pretrain.py``, fitted by maximum likelihood, -log p(x)
per token.

``--base`` starts from a full-sequence masked diffusion checkpoint instead (``JointModel.as_autoregressive``: its
weights, rank-1 head and tokenizer, its attention made causal): the AR model at a block model's start and budget.

    python training/train_ar.py --config qm9 --out runs/qm9-ar --max-minutes 150 --resume
    python training/train_ar.py --config tiny --data tests/data/qm9_sample.txt --out runs/tiny-ar --max-steps 50
    python training/train_ar.py --config qm9_finetune --base checkpoints/qm9-none-r1 --out runs/qm9-ar-from-mdlm \
        --max-steps 1200 --resume
    python training/train_ar.py --config text --tokenizer checkpoints/text-tt-r4 --out runs/text-ar --resume
"""

from _common import config_from_args, dataset, finds_train_state, new_or_resumed, parser, report, tensors
from _loop import fit

from ttcore.kinds.autoregressive import ar_loss
from ttcore.models import load_checkpoint


def from_base(args, cfg):
    """``--base``'s model as an autoregressive model, its tokenizer, and the data encoded with it -> (model,
    tokenizer, train, val)."""
    base, tokenizer, _ = load_checkpoint(args.base)
    try:
        model = base.as_autoregressive()
    except ValueError as e:
        raise SystemExit(f"--base {args.base}: {e}") from None
    cfg.data.length = tokenizer.length
    return (model, tokenizer, *tensors(dataset(cfg, tokenizer)))


def main():
    ap = parser(__doc__)
    ap.add_argument("--tokenizer", help="a directory holding the tokenizer.json to use (a checkpoint's: the AR model "
                                        "then shares the diffusion model's vocabulary, as EDLM and DCD need)")
    ap.add_argument("--base", help="a full-sequence masked diffusion checkpoint (rank 1) to start from (its "
                                   "weights, head and tokenizer)")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.causal": True, "model.latent_dim": 0})
    if args.base and not finds_train_state(args):
        (model, tokenizer, train, val), resuming = from_base(args, cfg), False
    else:
        model, tokenizer, train, val, resuming = new_or_resumed(args, cfg)
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=f"{cfg.data.family} autoregressive", quiet=args.quiet,
               fit_minutes=args.fit_minutes, objective=ar_loss)
    report(args, meta)


if __name__ == "__main__":
    main()
