"""Export a training checkpoint for bundling: weights cast (bfloat16 by default), no train state, and its
training config in the current shape (``migrate_train_config``: the one place configs written before the
``model:`` / ``data:`` sections are read).

    python training/export.py --src runs/qm9-tt-r8 --out checkpoints/qm9-tt-r8 --dtype bfloat16 \
        --family qm9 --note "validity table: see README"
"""

import argparse
from pathlib import Path

import torch

from ttcore.models import load_checkpoint, read_train_config, save_checkpoint
from ttcore.recipes import MODEL_KEYS, TrainConfig

FLAT_DATA_KEYS = ("family", "tokenizer", "bpe_vocab", "length", "val_fraction")  # top-level before ``data:``


def migrate_train_config(values: dict) -> dict:
    """A training config in the current shape. Configs written before the sections kept the model's keys and the
    data's settings at the top level and ``data`` as a source name or path (every key recorded, the text-only
    ones too): they become the ``model:`` and ``data:`` sections they meant. Current configs pass unchanged;
    the result is checked by ``TrainConfig.from_dict``."""
    values = dict(values)
    model = dict(values.pop("model", None) or {})
    model.update({k: values.pop(k) for k in [k for k in values if k in MODEL_KEYS and k != "length"]})
    flat = {k: values.pop(k) for k in FLAT_DATA_KEYS if k in values}
    data = values.get("data")
    if isinstance(data, str) or (data is None and flat):
        data = data or "qm9"
        section = {"source": data, **{k: flat[k] for k in ("family", "val_fraction") if k in flat}}
        if data == "text":  # the tokenizer keys meant something only for the text corpus
            section.update({k: flat[k] for k in ("tokenizer", "bpe_vocab", "length") if k in flat})
        values["data"] = section
    elif flat:
        values["data"] = {**(data or {}), **flat}
    values["model"] = model
    TrainConfig.from_dict(values)  # raises, naming the key, for anything it does not know
    return values


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
    trained = read_train_config(args.src)
    save_checkpoint(args.out, model, tok, dtype=getattr(torch, args.dtype), model_card=card,
                    train_config=None if trained is None else migrate_train_config(trained))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
