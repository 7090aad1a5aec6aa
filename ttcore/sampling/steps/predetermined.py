"""A predetermined ordering's step (random, left-to-right, Halton): the set T is fixed before the head runs
and x_T is drawn jointly and exactly (Sec. 4.3, ``joint_step.predetermined_step``)."""

from ..joint_step import predetermined_step
from ..orderings import PREDETERMINED
from .base import ConfiguredStep


class PredeterminedJointStep(ConfiguredStep):
    adaptive, batchable = False, True

    @classmethod
    def accepts(cls, config) -> bool:
        return config.joint and config.eb_gamma is None and config.ordering in PREDETERMINED

    def draw(self, run, h, tokens, masked, chosen, counts):
        c = self.config
        return predetermined_step(run.model, h, tokens, masked, chosen, c.temperature, run.generator, c.contraction)
