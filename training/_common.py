"""Argument parsing and data loading shared by the two recipes (kept out of the recipes' way)."""

import argparse
from pathlib import Path

import torch

from ttcore.data import SmilesDataset, load_qm9
from ttcore.training import load_config


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="qm9", help="YAML config: a path or a name in training/configs/")
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--data", help="qm9, or a file with one SMILES per line")
    ap.add_argument("--resume", action="store_true", help="continue exactly from --out if it holds a train state")
    ap.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    ap.add_argument("--max-minutes", type=float, help="stop (and checkpoint) after this much wall time")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--device", help="auto, cpu, cuda")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--quiet", action="store_true")
    return ap


CONFIGS = Path(__file__).resolve().parent / "configs"


def config_path(name_or_path: str) -> Path:
    """A YAML path, or the name of one in training/configs/."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if (CONFIGS / f"{name_or_path}.yaml").is_file():
        return CONFIGS / f"{name_or_path}.yaml"
    names = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    raise SystemExit(f"config {name_or_path!r} not found: a YAML path or one of {names}")


def config_from_args(args, extra: dict | None = None):
    overrides = list(args.set)
    for key in ("data", "seed", "device"):
        if getattr(args, key) is not None:
            overrides.append(f"{key}={getattr(args, key)}")
    for key, val in (extra or {}).items():
        if val is not None:
            overrides.append(f"{key}={val}")
    return load_config(config_path(args.config), overrides)


def dataset(cfg, tokenizer=None):
    if cfg.data == "text":
        from ttcore.data import load_text, training_texts
        from ttcore.tokenizers.text import gpt2_bpe, train_bpe

        if tokenizer is None:
            tokenizer = (gpt2_bpe(cfg.length) if cfg.tokenizer == "gpt2"
                         else train_bpe(training_texts(cfg.val_fraction), cfg.bpe_vocab, cfg.length))
        return load_text(tokenizer, val_fraction=cfg.val_fraction)
    if cfg.data == "qm9":
        ds = load_qm9(val_fraction=cfg.val_fraction)
    else:
        ds = SmilesDataset.from_file(cfg.data, val_fraction=cfg.val_fraction)
    if tokenizer is not None and tokenizer.to_dict() != ds.tokenizer.to_dict():
        ds = SmilesDataset(ds.train, ds.val, tokenizer)  # re-encode with the base model's tokenizer
    return ds


def tensors(ds) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens)
