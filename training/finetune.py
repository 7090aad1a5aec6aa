"""Fine-tune a pretrained MDM into a CP / Tensor-Train joint model (Sec. 4.5), or plain MDLM
fine-tuning (``--decomposition none``, the fair baseline at equal budget).

    python training/finetune.py --config qm9_finetune --base runs/qm9-base \
        --decomposition tt --rank 8 --head 1layer --out checkpoints/qm9-tt-r8 --max-steps 1500 --max-minutes 60 --resume
    python training/finetune.py --config text_finetune --base /path/to/mdlm-owt \
        --decomposition tt --rank 4 --head 2layer --out runs/owt-tt-r4 --set data.tokenizer=gpt2 data.length=1024

``--base`` may also be a joint checkpoint of the same decomposition, rank and head: the fine-tune then
continues from its weights (head included) with this recipe's fresh optimizer and schedule, e.g. to add
the marginal-consistency term to a trained model; a ``--rank`` that is a multiple of its rank grows it first
(the same joint, each hidden state or component split into copies: ``JointModel.with_rank``):

    python training/finetune.py --config text_finetune --base checkpoints/text-tt-r4 --decomposition tt \
        --rank 4 --head 2layer --out runs/text-tt-r4-m3 --set marginal_weight=3.0 --resume
"""

from pathlib import Path

import torch
from _common import config_from_args, dataset, finds_train_state, parser, tensors
from _loop import fit

from ttcore.decompositions import DECOMPOSITIONS, HEAD_KINDS, get_decomposition
from ttcore.models import JointModel, load_checkpoint
from ttcore.models.hf import is_hf_directory, load_masked_lm
from ttcore.models.mdlm_compat import is_mdlm_checkpoint, load_mdlm
from ttcore.parallel import is_main_process
from ttcore.recipes import throughput_line


def main():
    ap = parser(__doc__)
    ap.add_argument("--base", required=True, help="pretrained rank-1 checkpoint directory: a ttcore checkpoint, an "
                    "official MDLM directory, or a local transformers masked LM (ModernBERT, BERT, RoBERTa, ESM, ...)")
    ap.add_argument("--decomposition", choices=list(DECOMPOSITIONS))
    ap.add_argument("--rank", type=int)
    ap.add_argument("--head", choices=HEAD_KINDS)
    ap.add_argument("--train", choices=["all", "head"], default="all",
                    help="all: the backbone and the head; head: the backbone frozen for the whole run")
    args = ap.parse_args()
    cfg = config_from_args(args, {"model.decomposition": args.decomposition, "model.rank": args.rank,
                                  "model.head": args.head})
    head = cfg.model
    if not get_decomposition(head.decomposition).joint_head:
        head.rank = 1
    if args.train == "head":  # no step updates the backbone (AdamW leaves it and its moments alone)
        cfg.freeze_backbone_steps = 2**31 - 1
    resuming = finds_train_state(args)
    if resuming:
        model, tokenizer, _ = load_checkpoint(args.out)
    else:
        if is_mdlm_checkpoint(args.base):  # an official MDLM (e.g. mdlm-owt) directory
            base, tokenizer = load_mdlm(args.base, length=cfg.data.length)
        elif is_hf_directory(args.base):  # a transformers masked LM: its MLM decoder is the base head W
            base, tokenizer = load_masked_lm(args.base, length=cfg.data.length)
        else:
            base, tokenizer, _ = load_checkpoint(args.base)
        if not base.format.joint_head:
            model = JointModel.from_base(base, head.decomposition, head.rank, head.head, head.head_noise,
                                         torch.Generator().manual_seed(cfg.seed))
            model.cfg.extra["base"] = Path(args.base).name  # a name, not a path of this machine
        else:  # a joint checkpoint: continued as it is, head included, or grown to a multiple of its rank first
            check_same_joint(base, head)
            model = base if head.rank == base.cfg.rank else base.with_rank(
                head.rank, head.head_noise, torch.Generator().manual_seed(cfg.seed))
            model.cfg.extra["continued_from"] = Path(args.base).name
    model.cfg.extra.update(cfg.data.model_extra())  # the family it is trained on now
    for name in head.BACKBONE:  # the architecture is the base's: the recorded config (and card) says so
        setattr(head, name, getattr(model.cfg.dit, name))
    if cfg.data.length is None:  # and so is the length (a block base's may be padded past its data's own)
        cfg.data.length = tokenizer.length
    train, val = tensors(dataset(cfg, tokenizer))
    title = f"{cfg.data.family} {head.decomposition} r={head.rank} fine-tune of {Path(args.base).name}"
    meta = fit(model, tokenizer, train, val, cfg, args.out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=title, quiet=args.quiet, fit_minutes=args.fit_minutes)
    if is_main_process():
        print(f"wrote {args.out}: step {meta['step']}, val {meta['val']}, {meta['seconds_per_step']:.3f} s/step, "
              f"peak RSS {meta['peak_rss_mb']:.0f} MB")
        if meta.get("throughput"):
            print(throughput_line(meta["throughput"])[2:])


def check_same_joint(base: JointModel, head) -> None:
    """A joint checkpoint is fine-tuned further with its own weights, head included, so the requested
    decomposition and head must be its own, and the rank its own or a multiple of it (``JointModel.with_rank``)."""
    want = (head.decomposition, head.rank, head.head)
    have = (base.cfg.decomposition, base.cfg.rank, base.cfg.head)
    if want[0] != have[0] or want[2] != have[2] or want[1] % have[1]:
        raise SystemExit(f"--base is a {have[0]} r={have[1]} {have[2]} model: continuing it needs "
                         f"--decomposition {have[0]} --rank {have[1]} (or a multiple) --head {have[2]}, got {want}")


if __name__ == "__main__":
    main()
