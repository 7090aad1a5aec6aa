"""DCD (Liu et al., ICLR 2025, "Discrete Copula Diffusion", arXiv 2410.01949) with an autoregressive copula, as a
step over a diffusion checkpoint paired with an autoregressive one (``ttcore.kinds.pair``).

DCD keeps the diffusion model's univariate marginals p_dm(x^i | x_t) and takes the dependencies between the
positions from the AR model: the step's joint is the I-projection of the AR's joint onto those marginals,
q(x) proportional to p_AR(x) prod_i exp(theta_i(x^i)). DCD approximates the tilts by the ratio of two of the
diffusion model's marginals, theta_i = log p_dm(x^i | x_t) - log p_dm(x^i | x_t^{<i}): what the whole of x_t
tells of x^i beyond what the part an AR model sees (the tokens left of i) tells; and it samples q autoregressively,
each masked position from p_AR(. | x^{<i}) exp(theta_i) renormalized, the known tokens kept (its released code's
``scaled_autoregressive_generation``, alpha = 1). The step then commits the drawn tokens at its set T (the run's
ordering and schedule; a random ordering is DCD's chunk size 1, the setting the TT paper ran it with; ``dcd_chunk``
c > 1 orders chunks of c adjacent positions at random instead, left to right inside each, as DCD's chunked
predictor unmasks them).

p_dm(x^i | x_t^{<i}) is computed here as its name says: the diffusion model on x_t with every position from i on
masked (the released code runs SEDD with causal attention instead, which our bidirectional DiT was not trained
for). Where x_t has no known token right of i the two inputs are equal and theta_i = 0; so a step from the fully
masked state is the AR model's own draw.

Cost per step: the diffusion model's forward (the batch's), one more for each masked position left of a known
token up to the last position of T, and the AR pass: one AR forward of the sequence, then one position at a time
from its key-value cache up to the last position of T (``ttcore.models.kv_cache``; the released code keeps GPT-2's
``past_key_values`` likewise). The paper's sampling-time table puts DCD at 550 s a sequence against MDLM's 2.4."""

from dataclasses import dataclass

import torch

from ttcore.distributions import Site, sample_categorical, uniforms
from ttcore.errors import InvalidSampler
from ttcore.kinds import companion
from ttcore.kinds.autoregressive import next_token_log_probs
from ttcore.models.kv_cache import decode, prefill

from ..orderings import chunked_priority
from .base import ConfiguredStep, WorkKind
from .edlm import check_paired
from .settings import StepSettings, setting

FLOOR = 1e-16  # the released code clips both marginals here before the log ratio


def copula_tilts(full: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    """DCD's tilts theta = log p_dm(x^i | x_t) - log p_dm(x^i | x_t^{<i}) from the two marginals [..., v]."""
    return full.clamp_min(FLOOR).log() - left.clamp_min(FLOOR).log()


def left_context_marginals(model, x: torch.Tensor, masked: torch.Tensor, need: torch.Tensor, temperature,
                           contraction: str) -> torch.Tensor:
    """p_dm(x^i | x_t^{<i}) [n, v] float64 at the ``need`` [b, l] positions (row-major): the diffusion model on x_t
    with positions i.. masked, one sequence per needed position, in forward passes of at most b sequences (the
    rows admission sized the step for: up to l times as many sequences would otherwise go in one pass)."""
    rows, pos = need.nonzero().unbind(1)
    b, l = x.shape
    mask_id = model.cfg.dit.mask_id
    out = []
    for s in range(0, len(rows), b):
        r, p = rows[s:s + b], pos[s:s + b]
        right = torch.arange(l, device=x.device)[None, :] >= p[:, None]  # [n, l]
        xs = torch.where(right, torch.full_like(x[r], mask_id), x[r])
        ms = masked[r] | right
        at = torch.zeros_like(ms)
        at[torch.arange(len(p), device=x.device), p] = True
        temp = temperature[r] if torch.is_tensor(temperature) else temperature
        out.append(model.format.marginals_at(model.head, model.features(xs), ms, at, temp, contraction))  # its dtype
    return torch.cat(out)


def dcd_step(model, ar, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor, temperature,
             streams, contraction: str = "head") -> torch.Tensor:
    """One DCD step: the masked positions up to the last of ``chosen`` drawn left to right from the AR model tilted
    by ``copula_tilts`` (position i at lane i of Site.proposal), the known tokens kept; -> the tokens at ``chosen``
    [b, l], -1 elsewhere."""
    b, l = x.shape
    values = torch.full_like(x, -1)
    if not chosen.any():
        return values
    idx = torch.arange(l, device=x.device)[None, :]
    last = torch.where(chosen, idx, torch.full_like(idx, -1)).amax(1)  # [b]
    todo = masked & (idx <= last[:, None])  # what the AR pass draws
    known_after = (~masked).flip(1).cumsum(1).flip(1) - (~masked).long() > 0  # a known token right of i
    need = todo & known_after  # the positions with a tilt (elsewhere the two marginals are equal)
    theta = torch.zeros(b, l, model.cfg.dit.out_vocab, dtype=torch.float64, device=x.device)
    if bool(need.any()):
        full = model.format.marginals_at(model.head, h, masked, need, temperature, contraction)
        theta[need] = copula_tilts(full, left_context_marginals(model, x, masked, need, temperature, contraction))
    u = uniforms(streams, b, l, x.device, Site.proposal)
    cur = x.clone()
    rows = todo.any(1).nonzero()[:, 0]  # the rows the AR pass draws in
    sub, todo_sub, theta_sub, u_sub = cur[rows], todo[rows], theta[rows], u[rows]
    start = int(todo_sub.int().argmax(1).min())  # the first position drawn: every row's first masked one or later
    h, cache = prefill(ar, sub)  # the AR's features are right up to each row's first masked position
    for i in range(start, int(last.max()) + 1):
        if i > start:  # position i from the cache: what came before it is known or drawn in the rows that draw at i
            h = decode(ar, sub, cache, torch.full_like(rows, i))
        go = todo_sub[:, i]
        if not bool(go.any()):
            continue
        at = torch.zeros_like(sub, dtype=torch.bool)
        at[:, i] = True  # the AR head at position i alone
        log_p = next_token_log_probs(ar, h, at)[go].double() + theta_sub[go, i]  # [n, v]
        sub[go, i] = sample_categorical((log_p - log_p.amax(1, keepdim=True)).exp(), u=u_sub[go, i])
    cur[rows] = sub
    values[chosen] = cur[chosen]
    return values


MAX_DCD_CHUNK = 1024  # DCD's chunk of adjacent positions (a chunk past the length is the whole sequence)


@dataclass(frozen=True)
class DCDSettings(StepSettings):
    """DCD's own setting: its chunk of adjacent positions."""
    dcd_chunk: int = setting(1, "`sampler: dcd` with `ordering: random`: unmask chunks of this many adjacent "
                                "positions, the chunks in a random order (DCD's chunked unmasking); 1 (the "
                                "default, as the TT paper ran DCD): each position on its own.",
                             ge=1, le=MAX_DCD_CHUNK)

    def check(self, config) -> None:
        if self.dcd_chunk > 1 and (config.sampler != "dcd" or config.ordering != "random"):
            raise InvalidSampler("dcd_chunk", "dcd_chunk > 1 applies to sampler dcd with the random ordering")


class DCDStep(ConfiguredStep):
    """DCD by name (``sampler: dcd``) over a diffusion model paired with an autoregressive one; the run's ordering
    must be predetermined."""

    ar_cache = True
    Settings = DCDSettings

    def plan(self, run):
        check_paired(run, "dcd")
        if self.settings.dcd_chunk > 1:  # DCD's chunked unmasking: a random order of chunks (the random ordering)
            return chunked_priority(*run.tokens.shape, run.device, run.streams, self.settings.dcd_chunk)
        return super().plan(run)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        c = self.config
        return dcd_step(rows.model, companion(rows.model), h, tokens, masked, chosen, rows.temperature, rows.streams,
                        c.contraction)

    def work_kind(self, fmt) -> WorkKind:
        return WorkKind.dcd_step

    def work_scale(self, model_cfg) -> float:
        """Timed from the fully masked state, which needs no left-context forwards: at most one diffusion row
        per AR row, so at most twice the timed step (an upper bound)."""
        return 2.0
