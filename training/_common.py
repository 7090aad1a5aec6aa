"""Argument parsing and data loading shared by the two recipes (kept out of the recipes' way)."""

import argparse
from pathlib import Path

import torch

from ttcore.data import load_dataset
from ttcore.parallel import is_main_process
from ttcore.recipes import load_config


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="qm9", help="YAML config: a path or a name in training/configs/")
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--data", help="the data section's source: a corpus (qm9, moses, text) or a file of sequences")
    ap.add_argument("--resume", action="store_true", help="continue exactly from --out if it holds a train state")
    ap.add_argument("--max-steps", type=int, help="the run's budget: stop after this many optimizer steps (default: "
                                                  "the config's total_steps)")
    ap.add_argument("--max-minutes", type=float, help="a safety stop: stop (and checkpoint) after this much wall "
                                                      "time; the state and card record it (stopped_early), since a "
                                                      "comparison at an equal budget needs equal steps")
    ap.add_argument("--fit-minutes", type=float, help="size the run to this much training on this device: the "
                                                      "steps that fit, measured over the first steps and printed, "
                                                      "become the budget and the schedule's length")
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
    for key, name in (("data", "data.source"), ("seed", "seed"), ("device", "device")):
        if getattr(args, key) is not None:
            overrides.append(f"{name}={getattr(args, key)}")
    for key, val in (extra or {}).items():
        if val is not None:
            overrides.append(f"{key}={val}")
    return load_config(config_path(args.config), overrides)


def dataset(cfg, tokenizer=None):
    """The family of ``cfg.data``; with ``tokenizer`` (a base model's), encoded with it."""
    ds = load_dataset(cfg.data, tokenizer)
    if hasattr(ds, "summary") and is_main_process():
        print(f"data: {ds.summary()}")
    return ds


def tensors(ds) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens)


def finds_train_state(args) -> bool:
    """Whether ``--resume`` finds a train state at ``--out`` to continue from."""
    from ttcore.models import load_train_state

    return bool(args.resume) and Path(args.out).exists() and load_train_state(args.out) is not None


def new_or_resumed(args, cfg):
    """A from-scratch recipe's model: the checkpoint at ``--out`` when ``--resume`` finds a train state there, else a
    fresh one of ``cfg.model`` (seeded; its ``decomposition``, ``rank`` and ``head`` included) with the data's
    tokenizer or ``--tokenizer``'s. -> (model, tokenizer, train tokens, validation tokens, resuming)."""
    from ttcore.models import JointModel, ModelConfig, load_checkpoint
    from ttcore.tokenizers import load_tokenizer

    resumed = finds_train_state(args)
    if resumed:
        model, tokenizer, _ = load_checkpoint(args.out)
        ds = dataset(cfg, tokenizer)
    else:
        ds = dataset(cfg, load_tokenizer(args.tokenizer) if args.tokenizer else None)
        tokenizer = ds.tokenizer
        torch.manual_seed(cfg.seed)  # the initialization is part of the run's seed
        m = cfg.model  # a joint head from scratch where the config names one (the paper's way: finetune.py)
        model = JointModel(ModelConfig(m.dit_config(tokenizer), m.decomposition, m.rank, m.head,
                                       extra=cfg.data.model_extra()))
    return (model, tokenizer, *tensors(ds), resumed)


def report(args, meta: dict) -> None:
    """A from-scratch recipe's last lines: what it wrote, its validation and speed."""
    from ttcore.recipes import throughput_line

    if is_main_process():
        print(f"wrote {args.out}: step {meta['step']}, val {meta['val']}, {meta['seconds_per_step']:.3f} s/step, "
              f"peak RSS {meta['peak_rss_mb']:.0f} MB")
        if meta.get("throughput"):
            print(throughput_line(meta["throughput"])[2:])
