"""An adaptive ordering's step (top_prob, margin, entropy) by the exact chain rule (Sec. 4.2): the schedule's
count of picks, each the best free position by the marginals conditional on this step's earlier picks, drawn
before the next (``chain_rule_step``, which EB-Sampler's step runs too)."""

import torch

from ttcore.distributions import Site, sample_categorical, uniforms
from ttcore.distributions.automaton import Constrained

from ..eb import eb_accepts
from ..joint_step import joint_distribution
from ..orderings import ADAPTIVE, entropy
from .base import ConfiguredStep


def chain_rule_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, count: torch.Tensor | None,
                    score_fn, temperature: float, generator: torch.Generator | None,
                    eb_gamma: float | None = None, automaton=None) -> torch.Tensor:
    """Pick-and-sample ``count`` [b] tokens one at a time (Sec. 4.3, chain rule), each time the
    free masked position with the highest ``score_fn(marginals)``. With ``eb_gamma`` the count of a
    sequence whose ``count`` is -1 is EB-Sampler's: picks go on while the entropies of this step's picks
    (each conditional on the earlier ones) satisfy the bound, at least one, up to every masked position;
    ``count`` (None: all masked) caps the others. The p-th pick draws at lane p of ``Site.chain``.
    ``automaton`` (``Automata``, one per row): the chain rule on the joint restricted to its language
    (``ttcore.sampling.constrained``). -> [b, l], -1 where nothing was drawn."""
    b, l = x.shape
    dist = joint_distribution(model, h, x, masked, temperature)
    if automaton is not None:  # x_t's known tokens move the automaton by a gather (``backward_messages``)
        dist = Constrained(dist, automaton, torch.where(masked, torch.full_like(x, -1), x))
    x_cond = torch.where(masked, torch.full_like(x, -1), x)
    n_masked = masked.sum(1)
    count = n_masked if count is None else count
    by_eb = count < 0 if eb_gamma is not None else torch.zeros_like(masked[:, 0])  # [b]: EB's bound decides
    cap = torch.where(count < 0, n_masked, torch.minimum(count, n_masked))
    u = uniforms(generator, b, l, x.device, Site.chain)
    picked = torch.zeros(b, dtype=torch.long, device=x.device)
    entropies = torch.zeros(b, 0, dtype=torch.float64, device=x.device)
    active = picked < cap
    rows = torch.arange(b, device=x.device)
    while active.any():
        marg = dist.marginals(x_cond)  # TT caches sum_x G_j, which does not depend on the picks
        free = masked & (x_cond < 0)
        score = torch.where(free, score_fn(marg).double(), torch.full((b, l), -float("inf"), dtype=torch.float64,
                                                                           device=x.device))
        pos = score.argmax(-1)  # [b]
        p = marg[rows, pos]  # [b, v]
        if eb_gamma is not None:
            h_new = torch.cat([entropies, entropy(p).double()[:, None]], 1)
            ok = eb_accepts(h_new, eb_gamma)[:, -1] | (picked == 0) | ~by_eb
            active = active & ok
            entropies = torch.where(active[:, None], h_new, torch.cat([entropies, entropies.new_zeros(b, 1)], 1))
        draw = sample_categorical(p, u=u[rows, picked.clamp_max(l - 1)])
        x_cond[rows[active], pos[active]] = draw[active]
        picked = picked + active.long()
        active = active & (picked < cap)
    return torch.where(masked & (x_cond >= 0), x_cond, torch.full_like(x, -1))


class ChainRuleStep(ConfiguredStep):
    adaptive = True
    constrains = True

    @classmethod
    def accepts(cls, config) -> bool:
        return config.joint and config.eb_gamma is None and config.ordering in ADAPTIVE

    def draw(self, rows, h, tokens, masked, chosen, counts):
        c = self.config
        return chain_rule_step(rows.model, h, tokens, masked, counts, ADAPTIVE[c.ordering], rows.temperature,
                               rows.streams, automaton=rows.automaton)
