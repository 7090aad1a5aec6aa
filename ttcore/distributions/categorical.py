"""Exact categorical sampling in float64.

Zheng et al. (2024) show that float32 Gumbel-max sampling truncates the noise and biases masked
diffusion samplers towards low-entropy outputs. We draw by inverse CDF in float64: one uniform per
row, cumulative sums in float64, and a search; categories of probability zero are never drawn.

A draw takes its uniforms from a ``torch.Generator`` or, given ``u``, from elsewhere: the samplers pass
the counter-based ``Streams``' uniforms (``streams.py``), so each sequence's draw is its own whatever else
is batched with it.
"""

import torch


def tempered(logits: torch.Tensor, temperature, rows: torch.Tensor | None = None) -> torch.Tensor:
    """logits / temperature. ``temperature``: a float, or one per sequence ([b] tensor: a batch of requests with
    their own temperatures), applied to the entries of batch rows ``rows`` [n] (None: the logits' first axis is
    the batch's)."""
    if not torch.is_tensor(temperature):
        return logits / temperature
    t = temperature if rows is None else temperature[rows]
    return logits / t.to(logits.dtype).view(-1, *([1] * (logits.dim() - 1)))


def tempered_log_normalizer(logits: torch.Tensor, temperature, rows: torch.Tensor | None = None,
                            dim=-1) -> torch.Tensor:
    """log sum_x p(x)^(1/T) of the categoricals p = softmax(logits) over ``dim``: logsumexp(logits / T) -
    logsumexp(logits) / T (``tempered``'s temperature and rows), in the logits' dtype. What a tempered joint
    weighs each categorical by when its latent index is tempered with it (docs: concepts, temperature)."""
    return tempered(logits, temperature, rows).logsumexp(dim) - tempered(logits.logsumexp(dim), temperature, rows)


def entry_rows(temperature, mask: torch.Tensor) -> torch.Tensor | None:
    """The batch row of each True entry of ``mask`` [b, l] (row-major), for ``tempered``'s ``rows`` when the
    logits are those entries; None (nothing computed) for one temperature for all."""
    return mask.nonzero()[:, 0] if torch.is_tensor(temperature) else None


def is_one(temperature) -> bool:
    """Whether every sequence's temperature is 1 (a float or a [b] tensor)."""
    return bool((temperature == 1).all()) if torch.is_tensor(temperature) else temperature == 1.0


def softmax64(logits: torch.Tensor, temperature, dim: int = -1, rows: torch.Tensor | None = None) -> torch.Tensor:
    """float64 probabilities of logits / temperature (``tempered``), for categorical draws (the paper samples
    from 64-bit probabilities; a float32 softmax would truncate the small ones before the float64 draw)."""
    return torch.softmax(tempered(logits.double(), temperature, rows), dim)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None,
                       u: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one index per row of unnormalized nonnegative weights ``probs`` [..., n] -> [...] long, by
    inverse CDF at the uniforms ``u`` [...] (float64 in [0, 1)), or at fresh ones from ``generator``."""
    w = probs.to(torch.float64)
    cdf = w.cumsum(-1)  # [..., n]
    total = cdf[..., -1:]
    if u is None:
        u = torch.rand(w.shape[:-1] + (1,), dtype=torch.float64, device=w.device, generator=generator)
    else:
        u = u.to(torch.float64).reshape(w.shape[:-1] + (1,))
    idx = torch.searchsorted(cdf, u * total, right=True)  # first index with cdf > u * total
    return idx.clamp_max(w.shape[-1] - 1).squeeze(-1)
