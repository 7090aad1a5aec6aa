"""MDLM's continuous-time objective (Sahoo et al. 2024) for any joint p(x_M | x_t), and the bound.

Log-linear schedule alpha_t = 1 - t: with t ~ U[eps, 1] (antithetic strata), each token is masked
with probability t (Eq. 1), and the NELBO weight -alpha'_t / (1 - alpha_t) is 1 / t. SUBS: the model
never predicts [MASK] (it has no output for it) and known tokens are carried over exactly, so only the
masked set M is scored (Sec. 4.5, masked-token-only modeling).

Two quantities, not to be confused:
- the training objective, L_NLL of Eq. 3: -log p(x_M | x_t) of the *joint* over the masked set;
- the NELBO, a bound on the NLL of the continuous-time sampler. In the K -> infinity limit one token
  unmasks per infinitesimal step, drawn from the model's *single-position marginal* p(x^i | x_t), so the
  bound is  int_eps^1 (1/t) E[ sum_{i in M} -log p(x^i | x_t) ] dt,  with the joint's exact marginals
  (Eqs. 14-15 for CP, Eqs. 16-17 for TT, both with S = the unmasked positions). For rank 1 the two
  integrands coincide (MDLM's NELBO); for CP / TT the joint NLL weighted by 1/t is not a bound.
"""

import torch

from ttcore.decompositions.common import per_sequence
from ttcore.models.vadd import gaussian_kl, reparameterize


def sample_times(b: int, eps: float, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Low-discrepancy t in [eps, 1] (MDLM's antithetic sampling): one uniform, b strata. -> [b]."""
    u = torch.rand(1, device=device, generator=generator)
    t = (u + torch.arange(b, device=device) / b) % 1
    return (1 - eps) * t + eps


def forward_mask(x0: torch.Tensor, t: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q(x_t | x): each token is replaced by [MASK] with probability t (Eq. 1), t [b]. -> (x_t, mask)."""
    mask = torch.rand(x0.shape, device=x0.device, generator=generator) < t[:, None]
    return torch.where(mask, torch.full_like(x0, mask_id), x0), mask


def mdlm_loss(model, x0: torch.Tensor, mask_id: int, eps: float = 1e-3,
              generator: torch.Generator | None = None, t: torch.Tensor | None = None,
              marginal_weight: float = 0.0, mask: torch.Tensor | None = None, processes=None,
              z: torch.Tensor | None = None) -> dict:
    """One batch of the objective (Eq. 20: L_NLL + L_C). Returns, for this batch:
    - ``loss``: the joint NLL per masked token (below) plus L_C, plus ``marginal_weight`` times
      ``marginal_nll`` (the marginal-consistency term: the paper's L_marginal of Eq. 4, which it uses only
      to describe rank-1 training, here evaluated with the joint's exact single-position marginals, Eqs.
      14-17, and added to Eq. 20; ours: it fits the marginals the sampler draws from with one token per
      step; 0 by default, Eq. 20 alone); what the optimizer sees;
    - ``nll``: the joint NLL per masked token, sum_b -log p(x_{M_b} | x_t) / sum_b |M_b|: a ratio of
      batch totals, so every masked token weighs the same (not a mean of per-sequence averages);
    - ``marginal_nll``: the same with each token scored by its exact single-position marginal,
      sum_b sum_{i in M_b} -log p(x^i | x_t) / sum_b |M_b| (equal to ``nll`` for rank 1);
    - ``nelbo``: a one-sample Monte Carlo estimate of the NELBO in nats per position (padding included;
      module docstring),
      sum_b (1/t_b) sum_{i in M_b} -log p(x^i | x_t) / (b * l), t_b ~ U[eps, 1];
    - ``lc``: the decomposition's extra term (TT: L_C of Eq. 19; zero otherwise).
    The per-decomposition terms are in ``ttcore.decompositions`` (rank 1: Eq. 4; CP: Eqs. 6, 14-15;
    TT: Eqs. 9, 16-17, 19).
    ``marginal_nll`` and ``nelbo`` are metrics, computed without gradient unless ``marginal_weight`` > 0.

    ``t`` [b] and ``mask`` [b, l] (bool) fix the times and the masked set instead of drawing them; ``z`` [b, k]:
    a latent model's z (the denoiser given z).

    Data-parallel training and gradient accumulation (``processes``: ``ttcore.parallel.Workers``, or anything
    with ``world`` and ``all_sum``): ``x0`` is a share of a global batch (a process's, or a micro-batch of it),
    and every per-token normalizer (|M| of ``nll``, ``marginal_nll`` and L_C's 1/N) is the global batch's
    (``all_sum`` of the share's masked count). ``loss`` is then ``world`` times this share's part of the global
    objective, so that summing the micro-batches' gradients and averaging them over the processes
    (``Workers.average_gradients``) gives the gradient of the single-process objective on the global batch,
    whatever each share's masked count (a mean of per-share means would weigh a token of a share with few masked
    tokens more). The metrics returned beside it stay the share's own (its ratios).
    """
    b, l = x0.shape
    if t is None:
        t = sample_times(b, eps, x0.device, generator)
    if mask is None:
        x_t, mask = forward_mask(x0, t, mask_id, generator)
    else:
        x_t = torch.where(mask, torch.full_like(x0, mask_id), x0)
    out = model(x_t, mask, sigma=t) if z is None else model(x_t, mask, sigma=t, z=z)
    nll = -out.log_prob(x0)  # [b]
    n_masked = mask.sum().clamp_min(1)
    lc = out.auxiliary_loss()  # a mean over this share's masked positions (TT: Eq. 19's 1/N)
    with torch.set_grad_enabled(torch.is_grad_enabled() and marginal_weight > 0):
        per_position = per_sequence(-out.marginal_log_probs(x0), mask)  # [b]
    per_token = nll.sum() / n_masked
    marginal = per_position.sum() / n_masked
    if processes is None:
        loss = per_token + lc + marginal_weight * marginal if marginal_weight > 0 else per_token + lc
    else:
        loss = _global_share(nll.sum(), per_position.sum(), lc * mask.sum(), mask.sum(), marginal_weight,
                              processes)
    per_position = per_position.detach()
    return {"loss": loss, "nll": per_token.detach(), "lc": lc.detach(),
            "marginal_nll": marginal.detach(), "nelbo": (per_position / t).sum() / (b * l)}


def _global_share(nll_sum: torch.Tensor, marginal_sum: torch.Tensor, lc_sum: torch.Tensor, n_masked: torch.Tensor,
                  marginal_weight: float, processes) -> torch.Tensor:
    """This process's part of Eq. 20 (plus the marginal-consistency term) on the global batch: its sums over
    masked tokens divided by the global masked count, times the number of processes (``mdlm_loss``), so that
    the averaged gradient is the global objective's."""
    total = nll_sum + lc_sum + (marginal_weight * marginal_sum if marginal_weight > 0 else 0)
    n_global = processes.all_sum(n_masked.detach().float()).clamp_min(1)
    return total * processes.world / n_global


def vadd_loss(model, x0: torch.Tensor, mask_id: int, kl_weight: float = 1.0, eps: float = 1e-3,
              generator: torch.Generator | None = None, t: torch.Tensor | None = None) -> dict:
    """One batch of Eq. 21 (VADD with a joint head, Sec. 4.4), a one-sample estimate in nats per token:
    z ~ r_phi(z | x_0, x_t) by reparameterization, and

        (1 / (b l)) sum_b (1 / t_b) [ -log p_theta(x_0 | x_t, z) + lambda KL(r_phi(z | x_0, x_t) || p(z)) ]

    with -alpha'_t / (1 - alpha_t) = 1 / t (log-linear schedule) and E_r[log r / p] in closed form
    (``gaussian_kl``); p_theta(x_0 | x_t, z) is the model's joint over the masked set (rank 1, CP or TT,
    exactly as without z: known positions are carried over, SUBS). Returns ``loss`` (what the optimizer
    sees), ``nll``: the joint NLL per masked token given z ~ r_phi (a reconstruction term, not a likelihood
    of x_0: that would need z integrated out), ``kl``: the KL per sequence, and ``lc`` (L_C, Eq. 19).
    ``kl_weight`` is lambda."""
    b, l = x0.shape
    if t is None:
        t = sample_times(b, eps, x0.device, generator)
    x_t, mask = forward_mask(x0, t, mask_id, generator)
    mean, log_var = model.recognition(x0, x_t)
    z = reparameterize(mean, log_var, generator)
    out = model(x_t, mask, sigma=t, z=z)
    nll = -out.log_prob(x0)  # [b]
    kl = gaussian_kl(mean, log_var)  # [b]
    lc = out.auxiliary_loss()
    loss = ((nll + kl_weight * kl) / t).sum() / (b * l) + lc
    return {"loss": loss, "nll": nll.sum().detach() / mask.sum().clamp_min(1), "kl": kl.mean().detach(),
            "lc": lc.detach()}


def block_times(b: int, blocks: int, eps: float, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each block's own t in [eps, 1] (BD3-LM: every block masked at its own time), low-discrepancy over the
    b * blocks of a batch. -> [b, blocks]."""
    return sample_times(b * blocks, eps, device, generator).view(b, blocks)


def block_diffusion_loss(model, x0: torch.Tensor, mask_id: int, eps: float = 1e-3,
                         generator: torch.Generator | None = None, t: torch.Tensor | None = None,
                         mask: torch.Tensor | None = None) -> dict:
    """BD3-LM's objective (Arriola et al. 2025) with a joint head over each block: every block B of x0 [b, l]
    masked at its own time t_B (``block_times``; each token of B with probability t_B, Eq. 1), all blocks in one
    pass given the clean blocks before them (``block_attention.training_features``). The joint of a block's
    masked positions is the format's over that block alone (a block is a sequence of b positions: the formats'
    math unchanged), so the training objective is Eq. 3's joint NLL summed over blocks,
    sum_B -log p(x_{M_B} | x_t^B, x_{<B}), per masked token, plus the format's L_C (TT: Eq. 19). Returns
    ``loss``, ``nll`` (that joint NLL per masked token), ``lc`` and ``nelbo``: a one-sample estimate of the
    block NELBO in nats per position, sum_B (1/t_B) sum_{i in M_B} -log p(x^i | x_t^B, x_{<B}) / (b * l), with
    the joint's exact single-position marginals (for rank 1 BD3-LM's own bound; module docstring: for CP / TT it
    is the bound of the one-token-a-step sampler). ``t`` [b, blocks] and ``mask`` [b, l] fix the draws."""
    from ttcore.models.block_attention import split_blocks, training_features

    b, l = x0.shape
    size = model.cfg.dit.block_size
    if not size:
        raise ValueError("block_diffusion_loss takes a block diffusion model (dit.block_size > 0)")
    if t is None:
        t = block_times(b, l // size, eps, x0.device, generator)
    if mask is None:
        mask = torch.rand(x0.shape, device=x0.device, generator=generator) < t.repeat_interleave(size, 1)
    x_t = torch.where(mask, torch.full_like(x0, mask_id), x0)
    h = training_features(model, x_t, x0)
    masks = split_blocks(mask, size)
    out = model.head_outputs(split_blocks(h, size), masks)
    targets = split_blocks(x0, size)
    nll = -out.log_prob(targets)  # [b * blocks]
    n_masked = mask.sum().clamp_min(1)
    lc = out.auxiliary_loss()
    with torch.no_grad():
        per_block = per_sequence(-out.marginal_log_probs(targets), masks)  # [b * blocks]
    per_token = nll.sum() / n_masked
    return {"loss": per_token + lc, "nll": per_token.detach(), "lc": lc.detach(),
            "nelbo": (per_block / t.flatten()).sum() / (b * l)}
