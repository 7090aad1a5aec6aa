"""Loading a checkpoint to sample from: the one inference path of the service, evaluate.py, the benchmarks
and the tests (precision resolved, linears cast once, the model's compute context set)."""

from pathlib import Path

import torch

from .checkpoint import load_checkpoint
from .joint_model import JointModel
from .precision import bucket_linear_rows_, resolve_precision


def prepare_for_inference(model: JointModel, precision: str) -> JointModel:
    """Eval mode; bf16: every linear's weights cast once (``JointModel.cast_linears_``); the precision is
    remembered for ``model.compute_context()``. ``precision`` is fp32 or bf16 (resolve ``auto`` first)."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16 here (resolve 'auto' first), got {precision!r}")
    model.eval()
    if precision == "bf16":
        model.cast_linears_(torch.bfloat16)
        bucket_linear_rows_(model)  # bounded shapes: bounded oneDNN caches
    model.precision = precision
    return model


def load_for_inference(path: str | Path, device: str | torch.device = "cpu", precision: str = "auto"):
    """A checkpoint ready to sample: -> (model, tokenizer, config). Run it under ``model.compute_context()``."""
    model, tokenizer, config = load_checkpoint(path, device=device)
    return prepare_for_inference(model, resolve_precision(precision, device)), tokenizer, config
