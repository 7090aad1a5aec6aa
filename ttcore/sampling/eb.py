"""EB-Sampler (Ben-Hamu et al. 2025): an adaptive number of tokens per step.

Masked positions sorted by an error proxy ascending; the step unmasks the largest prefix whose
entropies satisfy  sum_{i <= k} H_i - max_{i <= k} H_i <= gamma  (at least one token). gamma = 0
unmasks one token per step; a larger gamma never unmasks fewer.
"""

import torch

from .orderings import entropy

# error proxies, lower = more certain: marginals [b, l, v] -> [b, l]
PROXIES = {
    "entropy": entropy,
    "confidence": lambda p: -p.amax(-1),
    "margin": lambda p: -(lambda t: t[..., 0] - t[..., 1])(p.topk(2, dim=-1).values),
}


def eb_accepts(picked_entropies: torch.Tensor, gamma: float) -> torch.Tensor:
    """The EB bound for each prefix: entropies [b, k] in pick order -> [b, k] bool
    (cumsum(H) - cummax(H) <= gamma)."""
    return picked_entropies.cumsum(-1) - picked_entropies.cummax(-1).values <= gamma
