"""Step schedules: how many masked tokens each of K denoising steps unmasks.

A schedule is the masked fraction f(t) at diffusion time t in [0, 1] (f(1) = 1, f(0) = 0); step k
goes from t_k = 1 - k/K to t_{k+1}. Deterministic counts are n f(t_k) - n f(t_{k+1}) rounded
(so K >= n gives one token per step); ``bernoulli`` counts are MDLM's exact update, each masked
token unmasked with probability (f(t_k) - f(t_{k+1})) / f(t_k).
"""

import math

import torch


def loglinear(t: float) -> float:
    """MDLM's log-linear noise, sigma(t) = -log(1 - t): the masked fraction is t (even counts)."""
    return t


def linear(t: float, sigma_max: float = 5.0) -> float:
    """Noise linear in time, sigma(t) = sigma_max t, renormalized so f(1) = 1: unmasks late."""
    return (1 - math.exp(-sigma_max * t)) / (1 - math.exp(-sigma_max))


def cosine(t: float) -> float:
    """MaskGIT's cosine schedule, masked fraction cos(pi/2 (1 - t)): few tokens early, many late."""
    return math.cos(0.5 * math.pi * (1 - t))


SCHEDULES = {"loglinear": loglinear, "linear": linear, "cosine": cosine}


def unmask_counts(n_initial: torch.Tensor, n_current: torch.Tensor, steps: int, step: int, schedule=loglinear,
                  bernoulli: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens to unmask at ``step`` (0-based) of ``steps``: deterministic counts from the initial
    masked count ``n_initial`` [b], or Binomial(n_current, p_k) draws (MDLM); the last step unmasks
    everything left. Never more than ``n_current``. -> [b] long."""
    if step >= steps - 1:
        return n_current.clone()
    t_now, t_next = 1 - step / steps, 1 - (step + 1) / steps
    if bernoulli:
        p = (schedule(t_now) - schedule(t_next)) / schedule(t_now)
        counts = torch.binomial(n_current.double(), torch.full(n_current.shape, p, dtype=torch.float64),
                                generator=generator).long()
    else:
        n = n_initial.double()
        counts = (torch.round(n * schedule(t_now)) - torch.round(n * schedule(t_next))).long()
    return torch.minimum(counts, n_current)
