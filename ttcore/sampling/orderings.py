"""Orderings: which masked positions a step unmasks first. Higher priority = earlier.

Predetermined orderings (the set T is known before any model output): random, left_to_right,
halton. Adaptive orderings score positions from the current conditional marginals: top_prob,
margin, entropy. Each is a plain function; names are looked up only at the edges.
"""

import torch

from ttcore.distributions import Site, uniforms

# --- adaptive: marginals [b, l, v] -> score [b, l]


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p(x^i | ...)) in nats, [b, l, v] -> [b, l]."""
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def top_prob_score(probs: torch.Tensor) -> torch.Tensor:
    """Highest max-probability first (Zheng et al. 2024)."""
    return probs.amax(-1)


def margin_score(probs: torch.Tensor) -> torch.Tensor:
    """Largest top-1 minus top-2 probability first."""
    top2 = probs.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def entropy_score(probs: torch.Tensor) -> torch.Tensor:
    """Lowest entropy first (Ye et al. 2025)."""
    return -entropy(probs)


ADAPTIVE = {"top_prob": top_prob_score, "margin": margin_score, "entropy": entropy_score}

# --- predetermined: (b, l, generator) -> priority [b, l]


def random_priority(b: int, l: int, device, generator=None) -> torch.Tensor:
    """A uniformly random order (with the step counts, MDLM's random unmasking)."""
    return uniforms(generator, b, l, device, Site.plan)


def left_to_right_priority(b: int, l: int, device, generator=None) -> torch.Tensor:
    return -torch.arange(l, device=device, dtype=torch.float64).expand(b, l)


def _van_der_corput_order(l: int) -> list[int]:
    """Positions in the order of the base-2 van der Corput sequence (1-D Halton), each once."""
    order, seen, i = [], set(), 0
    while len(order) < l:
        x, f, k = 0.0, 0.5, i
        while k:
            x, k, f = x + f * (k & 1), k >> 1, f / 2
        p = int(x * l)
        if p not in seen:
            seen.add(p)
            order.append(p)
        i += 1
    return order


def halton_priority(b: int, l: int, device, generator=None) -> torch.Tensor:
    """Low-discrepancy order (Besnier et al. 2025): spread the positions of each step over the
    sequence; a random cyclic shift per sample keeps samples from sharing one order."""
    rank = torch.empty(l, dtype=torch.float64, device=device)
    rank[torch.tensor(_van_der_corput_order(l), device=device)] = torch.arange(l, 0, -1, dtype=torch.float64,
                                                                               device=device)
    shift = (uniforms(generator, b, 1, device, Site.plan) * l).long().clamp_max(l - 1)  # [b, 1]
    idx = (torch.arange(l, device=device) + shift) % l  # [b, l]
    return rank[idx]


def chunked_priority(b: int, l: int, device, generator=None, chunk: int = 1) -> torch.Tensor:
    """A random order of chunks of ``chunk`` adjacent positions, left to right inside a chunk (DCD's chunked
    unmasking, Liu et al. 2025; chunk 1 is ``random_priority``'s law). Chunk c's uniform is lane c of
    ``Site.plan``."""
    pos = torch.arange(l, device=device)
    u = uniforms(generator, b, (l + chunk - 1) // chunk, device, Site.plan)  # [b, chunks]
    return u[:, pos // chunk] - (pos % chunk).to(torch.float64) * 1e-12  # ties inside a chunk: by position


PREDETERMINED = {"random": random_priority, "left_to_right": left_to_right_priority, "halton": halton_priority}


def top_k_mask(priority: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k[b] highest-priority candidate positions of each row. -> [b, l] bool."""
    p = torch.where(candidates, priority, torch.full_like(priority, -float("inf")))
    rank = p.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1, stable=True)  # [b, l]
    return (rank < k[:, None]) & candidates
