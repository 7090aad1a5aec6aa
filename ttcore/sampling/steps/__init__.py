"""The step classes: one algorithm each for drawing a denoising step's tokens, with one contract
(``Step``). ``STEP_CLASSES`` is the registry ``SamplerConfig.step`` picks from (the first that accepts the
settings); a new sampler is a new file here plus one entry."""

from .base import Step
from .chain_rule import ChainRuleStep
from .eb import EBStep
from .marginal_view import MarginalViewStep
from .predetermined import PredeterminedJointStep

STEP_CLASSES: list[type[Step]] = [MarginalViewStep, EBStep, ChainRuleStep, PredeterminedJointStep]


def register_step(cls: type[Step]) -> type[Step]:
    """Put a step class first in the registry (its ``accepts`` decides which settings it takes)."""
    STEP_CLASSES.insert(0, cls)
    return cls


__all__ = ["STEP_CLASSES", "ChainRuleStep", "EBStep", "MarginalViewStep", "PredeterminedJointStep", "Step",
           "register_step"]
