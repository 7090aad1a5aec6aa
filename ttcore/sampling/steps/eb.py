"""EB-Sampler's step (Ben-Hamu et al. 2025) by the chain rule: picks ranked by the error proxy go on while
their conditional entropies satisfy the bound, so the step decides its own count (``eb_counts``); the last
allowed step takes what is left."""

from ..eb import eb_score
from .base import ConfiguredStep, eb_counts
from .chain_rule import chain_rule_step


class EBStep(ConfiguredStep):
    adaptive = True
    constrains = True

    @classmethod
    def accepts(cls, config) -> bool:
        return config.joint and config.eb_gamma is not None

    def plan(self, run):
        return None  # no ordering: the proxy ranks

    def counts(self, rows, n_current):
        return eb_counts(rows, n_current)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        c = self.config  # counts -1: EB's bound decides; else a last step, which takes every masked position
        return chain_rule_step(rows.model, h, tokens, masked, counts, eb_score(c.eb_proxy), rows.temperature,
                               rows.streams, c.eb_gamma, rows.automaton)
