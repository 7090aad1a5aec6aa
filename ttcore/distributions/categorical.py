"""Exact categorical sampling in float64.

Zheng et al. (2024) show that float32 Gumbel-max sampling truncates the noise and biases masked
diffusion samplers towards low-entropy outputs. We draw by inverse CDF in float64: one uniform per
row, cumulative sums in float64, and a search; categories of probability zero are never drawn.

``RowStreams`` lets several generation runs share one batch: each run's rows draw their uniforms
from that run's own generator, in the same order and number as when it runs alone.
"""

import torch


class RowStreams:
    """Independent random streams for consecutive row blocks of one batch: block i (``sizes[i]``
    rows) draws from ``generators[i]`` exactly the numbers it would draw alone."""

    def __init__(self, generators: list[torch.Generator], sizes: list[int], device: torch.device | str):
        self.generators = generators
        self.block = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(device)  # [b]

    def uniform(self, rows: torch.Tensor) -> torch.Tensor:
        """One float64 uniform per entry of ``rows`` [n] (batch rows, ascending) -> [n, 1]."""
        counts = torch.bincount(self.block[rows].cpu(), minlength=len(self.generators)).tolist()
        parts = [torch.rand((c, 1), dtype=torch.float64, device=rows.device, generator=g)
                 for g, c in zip(self.generators, counts) if c]
        return torch.cat(parts) if parts else torch.empty((0, 1), dtype=torch.float64, device=rows.device)


def softmax64(logits: torch.Tensor, temperature: float, dim: int = -1) -> torch.Tensor:
    """float64 probabilities of logits / temperature, for categorical draws (the paper samples from
    64-bit probabilities; a float32 softmax would truncate the small ones before the float64 draw)."""
    return torch.softmax(logits.double() / temperature, dim)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | RowStreams | None = None,
                       rows: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one index per row of unnormalized nonnegative weights ``probs`` [..., n] -> [...] long.
    With ``RowStreams``, ``probs`` is [m, n] and ``rows`` [m] names each row's batch row (default:
    row i is batch row i)."""
    w = probs.to(torch.float64)
    cdf = w.cumsum(-1)  # [..., n]
    total = cdf[..., -1:]
    if isinstance(generator, RowStreams):
        rows = torch.arange(w.shape[0], device=w.device) if rows is None else rows
        u = generator.uniform(rows)  # [m, 1]
    else:
        u = torch.rand(w.shape[:-1] + (1,), dtype=torch.float64, device=w.device, generator=generator)
    idx = torch.searchsorted(cdf, u * total, right=True)  # first index with cdf > u * total
    return idx.clamp_max(w.shape[-1] - 1).squeeze(-1)
