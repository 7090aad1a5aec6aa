"""A predetermined ordering's step (random, left-to-right, Halton): the run draws its priorities once
(``plan``), each step's set T is the schedule's count of the highest-priority masked positions, fixed before
the head runs, and x_T is drawn jointly and exactly by the model's format (Sec. 4.3,
``joint_step.predetermined_step``)."""

from ..orderings import PREDETERMINED
from .base import ConfiguredStep


class PredeterminedJointStep(ConfiguredStep):
    constrains = True

    @classmethod
    def accepts(cls, config) -> bool:
        return config.joint and config.eb_gamma is None and config.ordering in PREDETERMINED

