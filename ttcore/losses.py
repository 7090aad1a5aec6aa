"""MDLM's continuous-time objective (Sahoo et al. 2024) for any joint p(x_M | x_t).

Log-linear schedule: a token is masked with probability (1 - eps) t, and the NELBO weight
-alpha'_t / (1 - alpha_t) is 1 / t. SUBS: the model never predicts [MASK] (it has no output for it)
and known tokens are carried over exactly, so only -log p(x_M | x_t) over the masked set M is scored
(Sec. 4.5, masked-token-only modeling).
"""

import torch
import torch.nn.functional as F

from ttcore.distributions import tt_chain_log_value
from ttcore.models import HeadOutputs


def sample_times(b: int, eps: float, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Low-discrepancy t in [eps, 1] (MDLM's antithetic sampling): one uniform, b strata. -> [b]."""
    u = torch.rand(1, device=device, generator=generator)
    t = (u + torch.arange(b, device=device) / b) % 1
    return (1 - eps) * t + eps


def forward_mask(x0: torch.Tensor, t: torch.Tensor, mask_id: int,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q(x_t | x): each token is replaced by [MASK] with probability t (Eq. 1). -> (x_t, mask)."""
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


def masked_log_prob(out: HeadOutputs, x0: torch.Tensor) -> torch.Tensor:
    """log p(x_M | x_t) for whichever joint the head parameterizes. -> [b]."""
    targets = x0[out.mask]
    if out.weight_logits is not None:
        return cp_masked_log_prob(out.weight_logits, out.logits, targets, out.mask)
    if out.logits.dim() == 4:
        return tt_masked_log_prob(out.logits, targets, out.mask)
    return factorized_masked_log_prob(out.logits, targets, out.mask)


def tt_contracted_targets(core_logits: torch.Tensor) -> torch.Tensor:
    """sum_x G_j(x) from core logits [m, v, r, r] -> [m, r, r] (row-stochastic)."""
    lse = core_logits.logsumexp(dim=(1, 3))  # [m, r]
    return (core_logits.logsumexp(1) - lse[:, :, None]).exp()


def contracted_core_loss(contracted_logits: torch.Tensor, core_logits: torch.Tensor) -> torch.Tensor:
    """L_C = (1/N) sum_j ||Gbar_j - stopgrad(sum_x G_j(x))||_F^2  (Eq. 21), over the masked positions."""
    if contracted_logits.shape[0] == 0:
        return contracted_logits.sum()
    pred = torch.softmax(contracted_logits, -1)  # rows of Gbar_j
    target = tt_contracted_targets(core_logits).detach()
    return (pred - target).pow(2).sum((-2, -1)).mean()


def mdlm_loss(model, x0: torch.Tensor, mask_id: int, eps: float = 1e-3,
              generator: torch.Generator | None = None, t: torch.Tensor | None = None) -> dict:
    """One batch of the objective. Returns
    - ``loss``: -log p(x_M | x_t) summed over the batch, normalized by |M| (paper, Sec. 4.5), plus L_C;
    - ``nll``: that NLL per masked token (no L_C);
    - ``nelbo``: MDLM's weighted bound in nats per token, sum_b (1/t_b) (-log p(x_M | x_t)) / (b * l);
    - ``lc``: L_C (zero without a contracted head).
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
    per_token = nll.sum() / n_masked
    return {"loss": per_token + lc, "nll": per_token.detach(), "lc": lc.detach(),
            "nelbo": (nll / t).sum().detach() / (b * l)}
