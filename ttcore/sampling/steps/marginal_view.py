"""The rank-1 view of a joint model (``joint=False``): each position of the step drawn independently from
the joint's exact single-position marginal (``joint_step.marginal_step``): at a predetermined ordering's set,
or, with an adaptive ordering, the schedule's count of the best by every masked position's marginal."""

from ..joint_step import marginal_step
from ..orderings import ADAPTIVE
from .base import ConfiguredStep


class MarginalViewStep(ConfiguredStep):
    def __init__(self, config):
        super().__init__(config)
        self.adaptive = config.ordering in ADAPTIVE

    @classmethod
    def accepts(cls, config) -> bool:
        return not config.joint

    def draw(self, rows, h, tokens, masked, chosen, counts):
        c = self.config
        return marginal_step(rows.model, h, tokens, masked, chosen, counts, ADAPTIVE.get(c.ordering), rows.temperature,
                             rows.streams, c.contraction)
