"""Adaptive orderings and EB-Sampler at about the cost of one marginal inference per step (the fast path;
``SamplerConfig(adaptive_path="fast")``), beside the exact chain rule (``chain_rule``, ``eb``) that stays the
reference.

A step computes every masked position's single-position marginal p(x^i | x_t) once (Eqs. 14-17, S = the
known positions), chooses its set T from them (fixed samplers: the ``counts`` best by the ordering's score;
EB: positions ranked by the error proxy, the largest prefix whose marginal entropies satisfy
sum H - max H <= gamma, at least one), then draws x_T jointly with the format's predetermined draw
(Sec. 4.3). The draw is exact with respect to the joint the predetermined step draws from (the head's
contraction, or the cores with ``contraction="exact"``); only the choice of T differs from the chain rule,
which re-ranks after every pick with the marginals conditional on the step's earlier picks.

What EB's rule means here: for independent draws, sum H - max H bounds the error of drawing T from the
product of its marginals instead of the joint (their total correlation); a joint draw does not make that
error, so the rule is kept as a budget on how much uncertainty one step commits (its steps-against-quality
trade-off), not as a bound.
"""

import torch

from ..eb import eb_accepts, eb_score
from ..joint_step import joint_distribution, predetermined_step
from ..orderings import ADAPTIVE, entropy
from .base import ConfiguredStep


class FastAdaptiveStep(ConfiguredStep):
    adaptive, batchable = True, False  # it holds every masked position's marginals, as the chain rule does

    @classmethod
    def accepts(cls, config) -> bool:
        return (config.joint and config.adaptive_path == "fast"
                and (config.eb_gamma is not None or config.ordering in ADAPTIVE))

    def draw(self, run, h, tokens, masked, chosen, counts):
        c = self.config
        b, l = tokens.shape
        x_cond = torch.where(masked, torch.full_like(tokens, -1), tokens)
        marg = joint_distribution(run.model, h, tokens, masked, c.temperature).marginals(x_cond)  # [b, l, v]
        score_fn = ADAPTIVE[c.ordering] if c.eb_gamma is None else eb_score(c.eb_proxy)
        score = torch.where(masked, score_fn(marg).double(),
                            torch.full((b, l), -float("inf"), dtype=torch.float64, device=tokens.device))
        order = score.argsort(dim=-1, descending=True, stable=True)  # [b, l]
        rank = order.argsort(dim=-1, stable=True)
        if counts is None:  # EB (not its last step): the largest prefix within the budget, at least one
            ent = torch.gather(entropy(marg).double(), 1, order)  # [b, l] in rank order
            ok = eb_accepts(torch.where(torch.gather(masked, 1, order), ent, torch.zeros_like(ent)), c.eb_gamma)
            counts = (ok.cumprod(-1).sum(-1)).clamp(min=1)
        k = torch.minimum(counts, masked.sum(1))
        mine = (rank < k[:, None]) & masked
        return predetermined_step(run.model, h, tokens, masked, mine, c.temperature, run.generator, c.contraction)
