"""EB-Sampler (Ben-Hamu et al. 2025): an adaptive number of tokens per step.

Masked positions sorted by an error proxy ascending (``EB_PROXIES``: each proxy is the negative of an
adaptive ordering's score, so the sampler ranks by that score); the step unmasks the largest prefix whose
entropies satisfy  sum_{i <= k} H_i - max_{i <= k} H_i <= gamma  (at least one token). gamma = 0
unmasks one token per step; a larger gamma never unmasks fewer.
"""

import torch

from .orderings import ADAPTIVE

# error proxy -> the adaptive ordering whose score is minus that proxy (lowest error = highest score):
# entropy H(p); confidence -max p (top_prob); margin -(top-1 minus top-2 probability)
EB_PROXIES = {"entropy": "entropy", "confidence": "top_prob", "margin": "margin"}


def eb_score(proxy: str):
    """The score EB-Sampler ranks positions by (highest first) for an error proxy: marginals -> [b, l]."""
    return ADAPTIVE[EB_PROXIES[proxy]]


def eb_accepts(picked_entropies: torch.Tensor, gamma: float) -> torch.Tensor:
    """The EB bound for each prefix: entropies [b, k] in pick order -> [b, k] bool
    (cumsum(H) - cummax(H) <= gamma)."""
    return picked_entropies.cumsum(-1) - picked_entropies.cummax(-1).values <= gamma
