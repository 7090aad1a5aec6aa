"""Fine-tune a pretrained MDM into a CP / Tensor-Train joint model (Sec. 4.5), or plain MDLM
fine-tuning (``--decomposition none``, the fair baseline at equal budget).

    python training/finetune.py --config qm9_finetune --base checkpoints/qm9-base \
        --decomposition tt --rank 8 --head 1layer --out checkpoints/qm9-tt-r8 --max-minutes 60 --resume
    python training/finetune.py --config text_finetune --base /path/to/mdlm-owt \
        --decomposition tt --rank 4 --head 2layer --out runs/owt-tt-r4 --set tokenizer=gpt2 length=1024
"""

from pathlib import Path

import torch
from _common import config_from_args, dataset, parser, tensors

from ttcore.models import JointModel, load_checkpoint, load_train_state
from ttcore.models.mdlm_compat import is_mdlm_checkpoint, load_mdlm
from ttcore.training import fit


def main():
    ap = parser(__doc__)
    ap.add_argument("--base", required=True, help="pretrained rank-1 checkpoint directory")
    ap.add_argument("--decomposition", choices=["none", "cp", "tt"])
    ap.add_argument("--rank", type=int)
    ap.add_argument("--head", choices=["1layer", "2layer"])
    args = ap.parse_args()
    cfg = config_from_args(args, {"decomposition": args.decomposition, "rank": args.rank, "head": args.head})
    if cfg.decomposition == "none":
        cfg.rank = 1
    resuming = args.resume and Path(args.out).exists() and load_train_state(args.out) is not None
    if resuming:
        model, tokenizer, _ = load_checkpoint(args.out)
    else:
        if is_mdlm_checkpoint(args.base):  # an official MDLM (e.g. mdlm-owt) directory
            base, tokenizer = load_mdlm(args.base, length=cfg.length)
        else:
            base, tokenizer, _ = load_checkpoint(args.base)
        model = JointModel.from_base(base, cfg.decomposition, cfg.rank, cfg.head, cfg.head_noise,
                                     torch.Generator().manual_seed(cfg.seed))
        model.cfg.extra["base"] = Path(args.base).name  # a name, not a path of this machine
    train, val = tensors(dataset(cfg, tokenizer))
    title = f"{cfg.data} {cfg.decomposition} r={cfg.rank} fine-tune of {Path(args.base).name}"
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=title, quiet=args.quiet)
    print(f"wrote {args.out}: step {meta['step']}, val {meta['val']}, {meta['seconds_per_step']:.3f} s/step, "
          f"peak RSS {meta['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
