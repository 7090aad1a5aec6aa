"""The step classes: one algorithm each for drawing a denoising step's tokens, with one contract
(``Step``). ``STEP_CLASSES`` is what ``SamplerConfig.step`` picks from by the settings (the first that
accepts them); ``SAMPLERS`` names the step classes a request may ask for by name (``sampler``). A new
sampler is a step class (``ConfiguredStep`` gives the schedule's counts and a predetermined ordering's choice)
and one ``register_step`` call, from anywhere."""

from .base import ConfiguredStep, Step, WorkKind
from .chain_rule import ChainRuleStep
from .eb import EBStep
from .fast_adaptive import FastAdaptiveStep
from .marginal_view import MarginalViewStep
from .predetermined import PredeterminedJointStep

STEP_CLASSES: list[type[Step]] = [MarginalViewStep, FastAdaptiveStep, EBStep, ChainRuleStep, PredeterminedJointStep]
SAMPLERS: dict[str, type[Step]] = {}  # named samplers beyond the settings-chosen ones (``SamplerConfig.sampler``)


def register_step(name: str, cls: type[Step]) -> type[Step]:
    """Make ``cls`` the sampler a request selects with ``sampler: name``."""
    if name in ("fixed", "eb"):
        raise ValueError(f"sampler name {name!r} is taken by the built-in samplers")
    SAMPLERS[name] = cls
    return cls


__all__ = ["SAMPLERS", "STEP_CLASSES", "ChainRuleStep", "ConfiguredStep", "EBStep", "FastAdaptiveStep",
           "MarginalViewStep", "PredeterminedJointStep", "Step", "WorkKind", "register_step"]
