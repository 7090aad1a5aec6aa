"""Helpers shared by the decompositions."""

import torch


def per_sequence(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scatter per-masked-position values [m, ...] into [b, l, ...] (zeros elsewhere), sum over l."""
    full = values.new_zeros(mask.shape + values.shape[1:])
    full[mask] = values
    return full.sum(1)


def output_dtype(t: torch.Tensor) -> torch.Tensor:
    """Head outputs as ``HeadOutputs`` holds them: float64 for a model run in float64, else float32 (bf16
    logits under autocast are upcast before any softmax)."""
    return t if t.dtype == torch.float64 else t.float()
