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
import torch.nn.functional as F

from ttcore.distributions import tt_chain_log_value, tt_contracted_from_logits, tt_state_marginals
from ttcore.models import HeadOutputs


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


def _per_sequence(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scatter per-masked-position values [m, ...] into [b, l, ...] (zeros elsewhere), sum over l."""
    full = values.new_zeros(mask.shape + values.shape[1:])
    full[mask] = values
    return full.sum(1)


def factorized_masked_log_prob(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_{i in M} log p(x^i | x_t) (Eq. 4). logits [m, v], targets [m] -> [b]."""
    return _per_sequence(-F.cross_entropy(logits, targets, reduction="none"), mask)


def cp_masked_log_prob(weight_logits: torch.Tensor, factor_logits: torch.Tensor, targets: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """log sum_a w_a prod_{i in M} p^(a,i)(x^i) (Eq. 6; known positions are one-hot, factor 1).
    weight_logits [b, r], factor_logits [m, r, v] -> [b]."""
    log_f = F.log_softmax(factor_logits, -1)
    log_f = log_f.gather(-1, targets[:, None, None].expand(-1, log_f.shape[1], 1)).squeeze(-1)  # [m, r]
    return torch.logsumexp(F.log_softmax(weight_logits, -1) + _per_sequence(log_f, mask), -1)


def tt_selected_log_cores(core_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log G_i(x^i, j, k) under the row normalization of Eq. 10 (softmax over (x, k) for each j),
    without materializing the normalized cores. core_logits [m, v, r, r] -> [m, r, r]."""
    lse = core_logits.logsumexp(dim=(1, 3))  # [m, r]  (over x and k, per row j)
    picked = core_logits[torch.arange(core_logits.shape[0], device=targets.device), targets]  # [m, r, r]
    return picked - lse[:, :, None]


def tt_masked_log_prob(core_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log (1/r) 1^T G_1(x^1) ... G_l(x^l) 1 (Eq. 9), known positions entering as the identity
    (delta(x = token) * I at their own token). core_logits [m, v, r, r] -> [b]."""
    b, l = mask.shape
    r = core_logits.shape[-1]
    mats = torch.eye(r, dtype=core_logits.dtype, device=core_logits.device).repeat(b, l, 1, 1)  # [b, l, r, r]
    mats[mask] = tt_selected_log_cores(core_logits, targets).exp()
    return tt_chain_log_value(mats)


def _format(out: HeadOutputs) -> str:
    """Which joint the head outputs parameterize: cp, tt or none (rank 1)."""
    return "cp" if out.weight_logits is not None else "tt" if out.logits.dim() == 4 else "none"


def masked_log_prob(out: HeadOutputs, x0: torch.Tensor) -> torch.Tensor:
    """log p(x_M | x_t) for whichever joint the head parameterizes. -> [b]."""
    targets, fmt = x0[out.mask], _format(out)
    if fmt == "cp":
        return cp_masked_log_prob(out.weight_logits, out.logits, targets, out.mask)
    if fmt == "tt":
        return tt_masked_log_prob(out.logits, targets, out.mask)
    return factorized_masked_log_prob(out.logits, targets, out.mask)


def cp_masked_marginal_log_probs(weight_logits: torch.Tensor, factor_logits: torch.Tensor,
                                 targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(x^i | x_t) = log sum_a w_a p^(a,i)(x^i) for each masked i (Eqs. 14-15, S = the known
    positions, whose factors are one-hot at their own token and so equal 1). -> [m]."""
    log_f = F.log_softmax(factor_logits, -1)
    log_f = log_f.gather(-1, targets[:, None, None].expand(-1, log_f.shape[1], 1)).squeeze(-1)  # [m, r]
    log_w = F.log_softmax(weight_logits, -1)[mask.nonzero()[:, 0]]  # [m, r]: each position's sequence
    return torch.logsumexp(log_w + log_f, -1)


def tt_masked_marginal_log_probs(core_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(x^i | x_t) for each masked i (Eqs. 16-17, S = the known positions, which contract to the
    identity): log pi_i^T G_i(x^i) 1 with pi_i the hidden-state marginal (``tt_state_marginals``).
    Needs only the selected and the summed cores, [m, r, r] each. core_logits [m, v, r, r] -> [m]."""
    b, l = mask.shape
    r = core_logits.shape[-1]
    gbar = torch.eye(r, dtype=core_logits.dtype, device=core_logits.device).repeat(b, l, 1, 1)  # [b, l, r, r]
    gbar[mask] = tt_contracted_from_logits(core_logits)
    log_pi = tt_state_marginals(gbar)[mask].clamp_min(torch.finfo(gbar.dtype).tiny).log()  # [m, r]
    return torch.logsumexp(log_pi[:, :, None] + tt_selected_log_cores(core_logits, targets), (1, 2))


def masked_marginal_log_probs(out: HeadOutputs, x0: torch.Tensor) -> torch.Tensor:
    """log p(x^i | x_t) under the joint's exact single-position marginal, per masked i. -> [m]."""
    targets, fmt = x0[out.mask], _format(out)
    if fmt == "cp":
        return cp_masked_marginal_log_probs(out.weight_logits, out.logits, targets, out.mask)
    if fmt == "tt":
        return tt_masked_marginal_log_probs(out.logits, targets, out.mask)
    return -F.cross_entropy(out.logits, targets, reduction="none")


def contracted_core_loss(contracted_logits: torch.Tensor, core_logits: torch.Tensor) -> torch.Tensor:
    """L_C = (1/N) sum_j ||Gbar_j - stopgrad(sum_x G_j(x))||_F^2  (Eq. 19), over the masked positions."""
    if contracted_logits.shape[0] == 0:
        return contracted_logits.sum()
    pred = torch.softmax(contracted_logits, -1)  # rows of Gbar_j
    target = tt_contracted_from_logits(core_logits).detach()
    return (pred - target).pow(2).sum((-2, -1)).mean()


def mdlm_loss(model, x0: torch.Tensor, mask_id: int, eps: float = 1e-3,
              generator: torch.Generator | None = None, t: torch.Tensor | None = None) -> dict:
    """One batch of the objective (Eq. 20: L_NLL + L_C). Returns, for this batch:
    - ``loss``: the joint NLL per masked token (below) plus L_C; what the optimizer sees;
    - ``nll``: the joint NLL per masked token, sum_b -log p(x_{M_b} | x_t) / sum_b |M_b|: a ratio of
      batch totals, so every masked token weighs the same (not a mean of per-sequence averages);
    - ``marginal_nll``: the same with each token scored by its exact single-position marginal,
      sum_b sum_{i in M_b} -log p(x^i | x_t) / sum_b |M_b| (equal to ``nll`` for rank 1);
    - ``nelbo``: a one-sample Monte Carlo estimate of the NELBO in nats per token (module docstring),
      sum_b (1/t_b) sum_{i in M_b} -log p(x^i | x_t) / (b * l), t_b ~ U[eps, 1];
    - ``lc``: L_C (zero without a contracted head).
    ``marginal_nll`` and ``nelbo`` are metrics: computed without gradient.
    """
    b, l = x0.shape
    if t is None:
        t = sample_times(b, eps, x0.device, generator)
    x_t, mask = forward_mask(x0, t, mask_id, generator)
    out = model(x_t, mask, sigma=t)
    nll = -masked_log_prob(out, x0)  # [b]
    n_masked = mask.sum().clamp_min(1)
    lc = (contracted_core_loss(out.contracted_logits, out.logits) if out.contracted_logits is not None
          else nll.new_zeros(()))
    with torch.no_grad():
        per_position = _per_sequence(-masked_marginal_log_probs(out, x0), mask)  # [b]
    per_token = nll.sum() / n_masked
    return {"loss": per_token + lc, "nll": per_token.detach(), "lc": lc.detach(),
            "marginal_nll": per_position.sum() / n_masked, "nelbo": (per_position / t).sum() / (b * l)}
