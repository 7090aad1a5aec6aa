"""Scoring sequences under a model: the exact joint log-probability of a masked set, the exact
single-position marginals, and the MDLM likelihood bound (ELBO) on -log p(x) by Monte Carlo.

- ``score``: log p(x_M | x_t) under the checkpoint's joint over the masked set M (CP: Eq. 6, TT: Eq. 9,
  both exact; rank 1: the product of Eq. 2), and log p(x^i | x_t) for each masked i under the joint's
  exact marginal (Eqs. 14-17 with S = the known positions). Exact with respect to the model's head.
- ``elbo``: the continuous-time NELBO of ``losses`` (module docstring), int (1/t) E[sum_{i in M} -log
  p(x^i | x_t)] dt, per sequence, in nats per token, estimated over ``num_mc`` antithetic draws of
  (t, M): its mean and the standard error of that mean. It bounds -log p(x) for the model whose
  per-position conditionals are the joint's exact marginals (the ones scored here); a sampler that
  draws from another distribution (the TT head contraction, ``ttcore.sampling.joint_step``) is not
  what it bounds. ``counted`` restricts the sum and the per-token division to the real tokens of a
  padded sequence: padding is still masked and fed to the model, but its terms are not counted, so the
  figure is the real tokens' share of the bound, per real token (exp of it: the ELBO perplexity diffusion
  LMs report). The standard error is the draws' sample standard error: the 1/t weights are heavy-tailed,
  so at a few draws it understates the spread (a rough figure, not a confidence interval).
"""

import math

import torch

from ttcore.decompositions.common import per_sequence
from ttcore.losses import forward_mask, sample_times


@torch.no_grad()
def score(model, x0: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 [b, l] tokens, mask [b, l] the positions to score -> (log p(x_M | x_t) [b], per-position
    log p(x^i | x_t) [b, l] with NaN where not masked). The rest of x0 is the model's input x_t."""
    x_t = torch.where(mask, torch.full_like(x0, model.cfg.dit.vocab_size - 1), x0)
    t = mask.float().mean(1)  # the masked fraction: the diffusion time of x_t under the log-linear schedule
    out = model(x_t, mask, sigma=t)
    token = torch.full(x0.shape, float("nan"), dtype=torch.float64, device=x0.device)
    token[mask] = out.marginal_log_probs(x0).double()
    return out.log_prob(x0).double(), token


@torch.no_grad()
def elbo_draw(model, x0: torch.Tensor, t: torch.Tensor, counted: torch.Tensor,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw of the NELBO at time ``t`` (a scalar tensor): each token masked with probability t, the
    masked tokens scored by their exact marginals, weighted by 1/t; summed over the ``counted`` positions
    [b, l] and divided by their number -> [b] nats per counted token."""
    b, _ = x0.shape
    tt = t.expand(b)
    x_t, mask = forward_mask(x0, tt, model.cfg.dit.vocab_size - 1, generator)
    out = model(x_t, mask, sigma=tt)
    terms = -out.marginal_log_probs(x0).double() * counted[mask]  # [m]: padding's terms not counted
    return per_sequence(terms, mask) / t.double() / counted.sum(1).clamp_min(1).double()


def elbo_summary(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draws [num_mc, b] -> (their mean [b], its standard error [b]; NaN for a single draw)."""
    num_mc, b = values.shape
    stderr = values.std(0) / math.sqrt(num_mc) if num_mc > 1 else torch.full((b,), float("nan"), dtype=torch.float64)
    return values.mean(0), stderr


@torch.no_grad()
def elbo(model, x0: torch.Tensor, num_mc: int, generator: torch.Generator | None = None,
         eps: float = 1e-3, counted: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The NELBO of each sequence in nats per (counted) token: (mean over ``num_mc`` draws [b], its
    standard error [b]). Each draw (``elbo_draw``): t ~ U[eps, 1] (antithetic over the draws).
    ``counted`` [b, l]: the positions whose terms count (default: all)."""
    counted = torch.ones_like(x0, dtype=torch.bool) if counted is None else counted
    times = sample_times(num_mc, eps, x0.device, generator)  # [num_mc] strata over the draws
    return elbo_summary(torch.stack([elbo_draw(model, x0, t, counted, generator) for t in times]))
