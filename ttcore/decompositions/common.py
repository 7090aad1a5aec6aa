"""Helpers shared by the decompositions."""

import torch


def per_sequence(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scatter per-masked-position values [m, ...] into [b, l, ...] (zeros elsewhere), sum over l."""
    full = values.new_zeros(mask.shape + values.shape[1:])
    full[mask] = values
    return full.sum(1)
