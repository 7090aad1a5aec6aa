"""EDLM (Xu et al., ICLR 2025, "Energy-Based Diffusion Language Models for Text Generation", arXiv 2410.21357)
with its autoregressive energy, as a step over a diffusion checkpoint paired with an autoregressive one
(``ttcore.models.ar.pair``).

EDLM's denoiser is p(x | x_t) proportional to p_diff(x | x_t) exp(-E(x)), with the residual energy of an AR model
E(x) = -log p_AR(x) + sum_{i masked} log p_diff(x^i | x_t): the product is p_AR(x) on the sequences that agree
with x_t's known tokens, p_AR(x_M | x_known). It is sampled by importance sampling with the diffusion model as the
proposal: k candidates x_1..x_k drawn from the diffusion model's per-position marginals (the rank-1 step's law), one
of them picked with probability proportional to w_j = exp(-E(x_j)) = p_AR(x_j) / prod_{i masked} p_diff(x_j^i | x_t),
and the step commits that candidate's tokens at its set T (the run's ordering and schedule, as any step). Only
steps whose time t (1 - step / steps, the fraction still masked by the schedule) lies in the window
|t - 1/2| <= w / 2 sample this way (EDLM's released code: 0.4 <= t <= 0.6); the others commit the first candidate,
the plain diffusion step. Defaults: k = 2, w = 1 (every step), the settings the TT paper ran EDLM with.

Cost per step: the diffusion model's forward (the batch's), then one AR forward over k candidates a sequence."""

import torch

from ttcore.distributions import Site, sample_categorical, uniforms
from ttcore.models.ar import ar_log_prob, companion

from .base import ConfiguredStep, WorkKind


def edlm_log_weights(ar_log_p: torch.Tensor, proposal_log_q: torch.Tensor) -> torch.Tensor:
    """EDLM's importance weights: log w = -E(x) = log p_AR(x) - log q(x), with q the proposal's law of the
    masked tokens (prod_i p_diff(x^i | x_t)). Any shape; float64."""
    return ar_log_p.double() - proposal_log_q.double()


def in_window(t: torch.Tensor, window: float) -> torch.Tensor:
    """Whether a step at time t (fraction still masked, [b]) samples by EDLM's weights: |t - 1/2| <= w / 2."""
    return (t - 0.5).abs() <= window / 2 + 1e-12


def edlm_step(model, ar, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
              t: torch.Tensor, candidates: int, window: float, temperature, streams,
              contraction: str = "head") -> torch.Tensor:
    """One EDLM step: ``candidates`` proposals of every masked position from the diffusion model's marginals
    (Site.proposal, lane j * l + i), one picked by ``edlm_log_weights`` (Site.select, lane 0) where ``in_window``,
    the first elsewhere; its tokens at ``chosen`` [b, l] are returned ([b, l], -1 elsewhere)."""
    b, l = x.shape
    k = candidates
    values = torch.full_like(x, -1)
    if not chosen.any():
        return values
    marg = model.format.marginals_at(model.head, h, masked, masked, temperature, contraction)  # [m, v] float64
    rows = masked.nonzero()[:, 0]
    u = uniforms(streams, b, k * l, x.device, Site.proposal).view(b, k, l)
    cand = x[:, None].repeat(1, k, 1)  # [b, k, l]
    log_q = torch.zeros(b, k, dtype=torch.float64, device=x.device)
    for j in range(k):
        drawn = sample_categorical(marg, u=u[:, j][masked])  # [m]
        cand[:, j][masked] = drawn
        log_q[:, j].index_add_(0, rows, marg.gather(1, drawn[:, None])[:, 0].clamp_min(1e-300).log())
    use = in_window(t.to(torch.float64), window) & (k > 1)
    pick = torch.zeros(b, dtype=torch.long, device=x.device)
    if bool(use.any()):
        seqs = cand[use].reshape(-1, l)  # AR passes of at most b sequences: the rows admission sized the step for
        log_p = torch.cat([ar_log_prob(ar, seqs[s:s + b]) for s in range(0, len(seqs), b)]).view(-1, k)
        log_w = edlm_log_weights(log_p, log_q[use])
        w = (log_w - log_w.amax(1, keepdim=True)).exp()
        pick[use] = sample_categorical(w, u=uniforms(streams, b, 1, x.device, Site.select)[use, 0])
    best = cand[torch.arange(b, device=x.device), pick]
    values[chosen] = best[chosen]
    return values


class EDLMStep(ConfiguredStep):
    """EDLM by name (``sampler: edlm``) over a diffusion model paired with an autoregressive one; the run's ordering
    must be predetermined (its set T fixed before the step draws)."""

    @classmethod
    def accepts(cls, config) -> bool:
        return False  # only by name

    def plan(self, run):
        check_paired(run, "edlm")
        return super().plan(run)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        c = self.config
        t = 1.0 - rows.step.double() / rows.steps.double()
        return edlm_step(rows.model, companion(rows.model), h, tokens, masked, chosen, t, c.edlm_candidates,
                         c.edlm_window, rows.temperature, rows.streams, c.contraction)

    def work_kind(self, fmt) -> WorkKind:
        return WorkKind.edlm_step


def check_paired(run, name: str) -> None:
    """Refuse (``InvalidSampler``, a ValueError naming the field) an AR-guided sampler on a model without its
    autoregressive pair, or with an ordering that does not fix the step's set before it draws."""
    from ..config import InvalidSampler as Refused
    from ..orderings import PREDETERMINED

    if run.latent is not None:
        raise Refused("sampler", f"sampler {name} takes a masked diffusion model without a latent (VADD, Di4C)")
    if companion(run.model) is None:
        raise Refused("sampler", f"sampler {name} needs an autoregressive model paired with this checkpoint "
                         "(ttcore.models.ar.pair; the service pairs a family's AR checkpoint)")
    if run.config.ordering not in PREDETERMINED:
        raise Refused("ordering", f"sampler {name} takes a predetermined ordering ({', '.join(PREDETERMINED)}), got "
                         f"{run.config.ordering!r}")
