"""An adaptive ordering's step (top_prob, margin, entropy) by the exact chain rule (Sec. 4.2): the schedule's
count of picks, each the best free position by the marginals conditional on this step's earlier picks, drawn
before the next (``joint_step.chain_rule_step``)."""

from ..joint_step import chain_rule_step
from ..orderings import ADAPTIVE
from .base import ConfiguredStep


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
