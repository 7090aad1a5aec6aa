"""EDLM (Xu et al., ICLR 2025, "Energy-Based Diffusion Language Models for Text Generation", arXiv 2410.21357)
with its autoregressive energy, as a step over a diffusion checkpoint paired with an autoregressive one
(``ttcore.kinds.pair``).

EDLM's denoiser is p(x | x_t) proportional to p_diff(x | x_t) exp(-E(x)), with the residual energy of an AR model
E(x) = -log p_AR(x) + log p_diff(x_M | x_t) (EDLM's rank-1 denoiser: sum_{i masked} log p_diff(x^i | x_t)): the
product is p_AR(x) on the sequences that agree
with x_t's known tokens, p_AR(x_M | x_known). It is sampled by importance sampling with the diffusion model as the
proposal: k candidates x_1..x_k drawn from the diffusion model's denoiser p_diff(x_M | x_t), one of them picked with
probability proportional to w_j = exp(-E(x_j)) = p_AR(x_j) / p_diff(x_j | x_t). For a rank-1 model (EDLM's own
case) that denoiser is the product of its per-position marginals; for a CP / TT model it is the joint head's p(x |
x_t), drawn jointly with its exact likelihood (``joint_proposals``: the joint head as EDLM's proposal, an
AR-auxiliary method and a joint head combined, as the TT paper combines its heads with latent-variable ones; at a
temperature other than 1 its exact marginals' product instead, the rank-1 view),
and the step commits that candidate's tokens at its set T (the run's ordering and schedule, as any step). Only
steps whose time t (1 - step / steps, the fraction still masked by the schedule) lies in the window
|t - 1/2| <= w / 2 sample this way (EDLM's released code: 0.4 <= t <= 0.6); the others commit the first candidate,
the plain diffusion step. Defaults: k = 2, w = 1 (every step), the settings the TT paper ran EDLM with.

Cost per step: the diffusion model's forward (the batch's), then one AR forward over k candidates a sequence (and for
a joint head, k joint draws and every masked position's full head outputs for the candidates' likelihoods)."""

from dataclasses import dataclass

import torch

from ttcore.distributions import Site, is_one, sample_categorical, uniforms
from ttcore.errors import InvalidSampler
from ttcore.kinds import companion
from ttcore.kinds.autoregressive import ar_log_prob

from .base import ConfiguredStep, WorkKind
from .settings import StepSettings, setting


def edlm_log_weights(ar_log_p: torch.Tensor, proposal_log_q: torch.Tensor) -> torch.Tensor:
    """EDLM's importance weights: log w = -E(x) = log p_AR(x) - log q(x), with q the proposal's law of the
    masked tokens (prod_i p_diff(x^i | x_t)). Any shape; float64."""
    return ar_log_p.double() - proposal_log_q.double()


def in_window(t: torch.Tensor, window: float) -> torch.Tensor:
    """Whether a step at time t (fraction still masked, [b]) samples by EDLM's weights: |t - 1/2| <= w / 2."""
    return (t - 0.5).abs() <= window / 2 + 1e-12


def proposes_jointly(fmt, temperature, joint: bool = True) -> bool:
    """Whether EDLM's candidates come from the model's joint (``joint_proposals``): a CP / TT format at
    temperature 1, unless ``joint`` is False (the rank-1 view); otherwise from its per-position marginals
    (``marginal_proposals``)."""
    return joint and fmt.joint_head and is_one(temperature)


def marginal_proposals(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, k: int, temperature, streams,
                       contraction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """k candidates [b, k, l] of every masked position drawn from the model's per-position marginals p(x^i | x_t)
    (a rank-1 model's factors; a joint head's exact marginals, the rank-1 view; Site.proposal, lane j * l + i), and
    log q [b, k] (float64), q their product."""
    b, l = x.shape
    marg = model.format.marginals_at(model.head, h, masked, masked, temperature, contraction)  # [m, v] float64
    rows = masked.nonzero()[:, 0]
    u = uniforms(streams, b, k * l, x.device, Site.proposal).view(b, k, l)
    cand = x[:, None].repeat(1, k, 1)  # [b, k, l]
    log_q = torch.zeros(b, k, dtype=torch.float64, device=x.device)
    for j in range(k):
        drawn = sample_categorical(marg, u=u[:, j][masked])  # [m]
        cand[:, j][masked] = drawn
        log_q[:, j].index_add_(0, rows, marg.gather(1, drawn[:, None])[:, 0].clamp_min(1e-300).log())
    return cand, log_q


def joint_proposals(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, k: int, streams,
                    contraction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """k candidates [b, k, l] of the masked positions drawn jointly from a CP / TT model's p(x | x_t) (its step's
    draw with every masked position chosen: exact with respect to Eq. 6 / 9, no position summed out; candidate j
    at ``Site.candidates`` (j + 1) on), and log q [b, k] (float64), each candidate's exact log-likelihood under that
    joint (``HeadOutputs.log_prob``, in pieces of rows whose full head outputs, float32 three times, fit the bytes
    admission reserves for a step that holds them, ``cost.summed_outputs_bytes``: at least one row)."""
    from ..cost import SUMMING_COPIES, summed_outputs_bytes

    b, l = x.shape
    cand = x[:, None].repeat(1, k, 1)
    log_q = torch.empty(b, k, dtype=torch.float64, device=x.device)
    per_row = SUMMING_COPIES * 4 * l * model.cfg.dit.out_vocab * model.format.outputs_per_position(model.cfg.rank)
    piece = summed_outputs_bytes(model.cfg) // per_row
    for j in range(k):
        drawn = model.format.draw(model.head, h, x, masked, masked, 1.0, streams.offset(Site.candidates * (j + 1)),
                                  contraction)
        cand[:, j] = torch.where(masked, drawn, x)
        for s in range(0, b, piece):
            log_q[s:s + piece, j] = model.head_outputs(h[s:s + piece], masked[s:s + piece]).log_prob(
                cand[s:s + piece, j]).double()
    return cand, log_q


def edlm_step(model, ar, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
              t: torch.Tensor, candidates: int, window: float, temperature, streams,
              contraction: str = "head", joint: bool = True) -> torch.Tensor:
    """One EDLM step: ``candidates`` proposals of every masked position from the diffusion model's denoiser, a CP /
    TT model's joint (``joint_proposals``; at a temperature other than 1 its exact marginals) or a rank-1 model's
    factors (``marginal_proposals``), one picked by ``edlm_log_weights`` (Site.select, lane 0) where ``in_window``,
    the first elsewhere; its tokens at ``chosen`` [b, l] are returned ([b, l], -1 elsewhere). ``joint`` False:
    a joint head's marginals propose (the rank-1 view, as ``joint: false`` draws elsewhere)."""
    b, l = x.shape
    k = candidates
    values = torch.full_like(x, -1)
    if not chosen.any():
        return values
    if proposes_jointly(model.format, temperature, joint):
        cand, log_q = joint_proposals(model, h, x, masked, k, streams, contraction)
    else:
        cand, log_q = marginal_proposals(model, h, x, masked, k, temperature, streams, contraction)
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


MAX_EDLM_CANDIDATES = 16  # EDLM's k: each candidate is one more AR forward of the sequence a step


@dataclass(frozen=True)
class EDLMSettings(StepSettings):
    """EDLM's own settings: its candidates a step and the times it weighs them at."""
    edlm_candidates: int = setting(2, "`sampler: edlm`: candidates k a step, each scored by the paired "
                                      "autoregressive checkpoint (one AR pass a candidate). EDLM's default 2.",
                                   ge=1, le=MAX_EDLM_CANDIDATES)
    edlm_window: float = setting(1.0, "`sampler: edlm`: the steps whose time t (the share still masked) has "
                                      "|t - 1/2| <= w / 2 pick by EDLM's weights; the others take the plain "
                                      "diffusion draw. 1 (the default, as the TT paper ran it): every step.",
                                 gt=0, le=1)


class EDLMStep(ConfiguredStep):
    """EDLM by name (``sampler: edlm``) over a diffusion model paired with an autoregressive one; the run's ordering
    must be predetermined (its set T fixed before the step draws)."""

    Settings = EDLMSettings

    def plan(self, run):
        check_paired(run, "edlm")
        c = self.config
        if c.contraction != "head" and proposes_jointly(run.model.format, c.temperature, c.joint):
            raise InvalidSampler("contraction", "sampler edlm over a joint head draws its candidates jointly, every "
                                 "masked position at once (none summed out): contraction applies only to its "
                                 "marginal proposals (joint: false, or a temperature other than 1)")
        return super().plan(run)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        c = self.config
        t = 1.0 - rows.step.double() / rows.steps.double()
        return edlm_step(rows.model, companion(rows.model), h, tokens, masked, chosen, t,
                         self.settings.edlm_candidates, self.settings.edlm_window, rows.temperature, rows.streams,
                         c.contraction, c.joint)

    def sums_outputs(self, fmt, temperature) -> bool:
        """Over a joint head at temperature 1 (``joint`` on) the candidates' likelihoods take every masked
        position's full head outputs (``joint_proposals``; admission reserves ``cost.summed_outputs_bytes``)."""
        return proposes_jointly(fmt, temperature, self.config.joint)

    def work_kind(self, fmt) -> WorkKind:
        return WorkKind.edlm_step

    def work_scale(self, model_cfg) -> float:
        """Timed at k = 2 (an AR pass a candidate): k / 2 beyond it."""
        return max(1.0, self.settings.edlm_candidates / 2)


def check_paired(run, name: str) -> None:
    """Refuse (``InvalidSampler``, a ValueError naming the field) an AR-guided sampler on a model without its
    autoregressive pair, or with an ordering that does not fix the step's set before it draws."""
    from ..orderings import PREDETERMINED

    if run.latent is not None:
        raise InvalidSampler("sampler", f"sampler {name} takes a masked diffusion model without a latent (VADD, Di4C)")
    if companion(run.model) is None:
        raise InvalidSampler("sampler", f"sampler {name} needs an autoregressive model paired with this checkpoint "
                             "(a server pairs its family's AR checkpoint if one is beside it; training/train_ar.py "
                             "makes one)")
    if run.config.ordering not in PREDETERMINED:
        raise InvalidSampler("ordering", f"sampler {name} takes a predetermined ordering "
                                         f"({', '.join(PREDETERMINED)}), got {run.config.ordering!r}")
