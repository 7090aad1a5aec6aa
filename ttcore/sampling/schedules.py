"""Step schedules: how many masked tokens each of K denoising steps unmasks.

A schedule is the masked fraction f(t) at diffusion time t in [0, 1] (f(1) = 1, f(0) = 0); step k
goes from t_k = 1 - k/K to t_{k+1}. Deterministic counts are n f(t_k) - n f(t_{k+1}) rounded
(so K >= n gives one token per step); ``bernoulli`` counts are MDLM's exact update, each masked
token unmasked with probability (f(t_k) - f(t_{k+1})) / f(t_k).
"""

import math

import torch

from ttcore.distributions import Site, uniforms


def loglinear(t: torch.Tensor) -> torch.Tensor:
    """MDLM's log-linear noise, sigma(t) = -log(1 - t): the masked fraction is t (even counts)."""
    return t


def linear(t: torch.Tensor, sigma_max: float = 5.0) -> torch.Tensor:
    """Noise linear in time, sigma(t) = sigma_max t, renormalized so f(1) = 1: unmasks late."""
    return (1 - torch.exp(-sigma_max * t)) / (1 - math.exp(-sigma_max))


def cosine(t: torch.Tensor) -> torch.Tensor:
    """MaskGIT's cosine schedule, masked fraction cos(pi/2 (1 - t)): few tokens early, many late."""
    return torch.cos(0.5 * math.pi * (1 - t))


SCHEDULES = {"loglinear": loglinear, "linear": linear, "cosine": cosine}


def unmask_counts(n_initial: torch.Tensor, n_current: torch.Tensor, steps, step, schedule=loglinear,
                  bernoulli: bool = False, generator=None, width: int | None = None) -> torch.Tensor:
    """Tokens to unmask at ``step`` (0-based) of ``steps`` (ints, or one per sequence [b]): deterministic
    counts from the initial masked count ``n_initial`` [b], or Binomial(n_current, p_k) draws (MDLM: one coin
    per masked position, ``width`` >= n_current of them per sequence from ``generator``, a torch.Generator
    or the batch's ``Streams`` at ``Site.coins``); the last step unmasks everything left. Never more than
    ``n_current``. -> [b] long."""
    b, device = n_current.shape[0], n_current.device
    step = torch.as_tensor(step, dtype=torch.float64, device=device).expand(b)
    steps = torch.as_tensor(steps, dtype=torch.float64, device=device).expand(b)
    f_now, f_next = schedule(1 - step / steps), schedule(1 - (step + 1) / steps)
    if bernoulli:
        p = (f_now - f_next) / f_now  # [b]
        width = int(n_current.max()) if width is None else width
        coins = uniforms(generator, b, width, device, Site.coins) < p[:, None]  # [b, width]
        counts = (coins & (torch.arange(width, device=device) < n_current[:, None])).sum(1)
    else:
        n = n_initial.double()
        counts = (torch.round(n * f_now) - torch.round(n * f_next)).long()
    return torch.where(step >= steps - 1, n_current, torch.minimum(counts, n_current))


def active_steps(n_initial: list[int], steps: int, schedule=loglinear) -> list[int]:
    """The deterministic steps (0-based, ascending) that unmask a token in some sequence, read from the schedule
    before any draw (``unmask_counts`` without coins: each count is a difference of rounded n f(t)); more steps
    than positions leaves most steps empty. The last step (it takes what is left) is always listed.
    ``n_initial``: each sequence's initial masked count."""
    k = torch.arange(steps - 1, dtype=torch.float64)
    n = torch.tensor(sorted(set(n_initial)) or [0], dtype=torch.float64)[:, None]  # equal counts step alike
    counts = torch.round(n * schedule(1 - k / steps)) - torch.round(n * schedule(1 - (k + 1) / steps))
    return (counts != 0).any(0).nonzero()[:, 0].tolist() + [steps - 1]
