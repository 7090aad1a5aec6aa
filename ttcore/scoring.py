"""Scoring sequences under a model: the exact joint log-probability of a masked set, the exact
single-position marginals, and the MDLM likelihood bound (ELBO) on -log p(x) by Monte Carlo.

- ``score``: log p(x_M | x_t) under the checkpoint's joint over the masked set M (CP: Eq. 6, TT: Eq. 9,
  both exact; rank 1: the product of Eq. 2), and log p(x^i | x_t) for each masked i under the joint's
  exact marginal (Eqs. 14-17 with S = the known positions). Exact with respect to the model's head.
- ``elbo``: the continuous-time NELBO of ``losses`` (module docstring), int (1/t) E[sum_{i in M} -log
  p(x^i | x_t)] dt, per sequence, estimated over ``num_mc`` antithetic draws of (t, M): its mean and the
  standard error of that mean. It bounds -log p(x) for the model whose per-position conditionals are the
  joint's exact marginals (the ones scored here); a sampler that draws from another distribution (the TT
  head contraction, ``ttcore.sampling.joint_step``) is not what it bounds. It is divided by the sequence's
  ``real`` tokens (those before its padding; exp of it: the ELBO perplexity diffusion LMs report), and
  sums the terms of ``all_terms``: every position, padding included (``all_terms=True``: the bound on
  -log p(x) of the padded sequence, which is how a family of variable length generates x), or the real
  positions only (``all_terms=False``: families cut into fixed-length blocks, which never generate
  padding; for a shorter sequence this is the real tokens' share of the bound, not a bound on its
  likelihood, and for a full block it is the bound). Dropping the padding terms of a variable-length family
  would not bound anything: an exact denoiser scores a two-sequence toy distribution at 0 and 0.448 nats
  where -log p(x) is 0.693 (tests/test_scoring.py). The standard error is the draws' sample standard
  error: the 1/t weights are heavy-tailed, so at a few draws it understates the spread (a rough figure,
  not a confidence interval).
"""

import math

import torch

from ttcore.decompositions.common import per_sequence
from ttcore.losses import forward_mask


@torch.no_grad()
def score(model, x0: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 [b, l] tokens, mask [b, l] the positions to score -> (log p(x_M | the rest) [b], per-position
    log p(x^i | the rest) [b, l] with NaN where not masked), as the model's kind scores (``ModelKind.score``: a
    diffusion model's joint given x_t, the rest of x0; an autoregressive model's suffix given its prefix)."""
    return model.cfg.kind.score(model, x0, mask)


@torch.no_grad()
def elbo_draw(model, x0: torch.Tensor, t: torch.Tensor, real: torch.Tensor, all_terms: bool,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw of the NELBO at times ``t`` (a scalar, or one per sequence [b]): each token masked with its
    sequence's probability t, the masked tokens scored by their exact marginals, weighted by 1/t; summed over
    every position (``all_terms``) or over the ``real`` ones [b, l], and divided by the number of real
    tokens -> [b] nats per real token (module docstring)."""
    b, _ = x0.shape
    tt = t.expand(b) if t.dim() == 0 else t
    x_t, mask = forward_mask(x0, tt, model.cfg.dit.mask_id, generator)
    out = model(x_t, mask, sigma=tt)
    terms = -out.marginal_log_probs(x0).double()  # [m]
    if not all_terms:
        terms = terms * real[mask]
    return per_sequence(terms, mask) / tt.double() / real.sum(1).clamp_min(1).double()


def elbo_summary(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draws [num_mc, b] -> (their mean [b], its standard error [b]; NaN for a single draw)."""
    num_mc, b = values.shape
    stderr = values.std(0) / math.sqrt(num_mc) if num_mc > 1 else torch.full((b,), float("nan"), dtype=torch.float64)
    return values.mean(0), stderr


def sequence_times(num_mc: int, b: int, eps: float, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """``num_mc`` antithetic strata of t in [eps, 1] for each of ``b`` sequences, each sequence with its own
    uniform offset -> [num_mc, b]. Sequences do not share their draws of t, so the spread of per-sequence
    estimates across sequences is that of independent estimates (a shared t made a batch's estimates move
    together: a standard error over sequences came out ~8x too small against the spread over seeds)."""
    u = torch.rand(b, device=device, generator=generator)
    t = (u[None] + torch.arange(num_mc, device=device)[:, None] / num_mc) % 1
    return (1 - eps) * t + eps


@torch.no_grad()
def elbo(model, x0: torch.Tensor, num_mc: int, generator: torch.Generator | None = None,
         eps: float = 1e-3, real: torch.Tensor | None = None, all_terms: bool = True
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The NELBO of each sequence in nats per real token: (mean over ``num_mc`` draws [b], its standard error
    [b]). Each draw (``elbo_draw``): t ~ U[eps, 1], antithetic over the draws, independent across sequences
    (``sequence_times``). ``real`` [b, l]: the tokens before padding (default: all)."""
    real = torch.ones_like(x0, dtype=torch.bool) if real is None else real
    times = sequence_times(num_mc, len(x0), eps, x0.device, generator)  # [num_mc, b]
    return elbo_summary(torch.stack([elbo_draw(model, x0, t, real, all_terms, generator) for t in times]))
