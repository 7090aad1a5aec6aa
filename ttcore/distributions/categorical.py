"""Exact categorical sampling in float64.

Zheng et al. (2024) show that float32 Gumbel-max sampling truncates the noise and biases masked
diffusion samplers towards low-entropy outputs. We draw by inverse CDF in float64: one uniform per
row, cumulative sums in float64, and a search; categories of probability zero are never drawn.
"""

import torch


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one index per row of unnormalized nonnegative weights ``probs`` [..., n] -> [...] long."""
    w = probs.to(torch.float64)
    cdf = w.cumsum(-1)  # [..., n]
    total = cdf[..., -1:]
    u = torch.rand(w.shape[:-1] + (1,), dtype=torch.float64, device=w.device, generator=generator)
    idx = torch.searchsorted(cdf, u * total, right=True)  # first index with cdf > u * total
    return idx.clamp_max(w.shape[-1] - 1).squeeze(-1)
