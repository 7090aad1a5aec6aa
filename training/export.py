"""Export a training checkpoint for bundling: weights cast (bfloat16 by default), no train state.

    python training/export.py --src runs/qm9-tt-r8 --out checkpoints/qm9-tt-r8 --dtype bfloat16 \
        --family qm9 --note "validity table: see README"
"""

import argparse
from pathlib import Path

import torch

from ttcore.models import load_checkpoint, read_train_config, save_checkpoint


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--family", default=None, help="model family served as `model` (e.g. qm9, text)")
    ap.add_argument("--note", default=None, help="a line appended to the model card")
    args = ap.parse_args()
    model, tok, _ = load_checkpoint(args.src)
    if args.family:
        model.cfg.extra["family"] = args.family
    card_path = Path(args.src) / "model_card.md"
    card = card_path.read_text() if card_path.exists() else f"# {args.out}\n"
    card += f"\nExported from `{args.src}` with weights in {args.dtype}.\n"
    if args.note:
        card += f"\n{args.note}\n"
    save_checkpoint(args.out, model, tok, dtype=getattr(torch, args.dtype), model_card=card,
                    train_config=read_train_config(args.src))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
