"""The step classes: one algorithm each for drawing a denoising step's tokens, with one contract
(``Step``). ``STEP_CLASSES`` is what ``SamplerConfig.step`` picks from by the settings (the first that
accepts them); ``SAMPLERS`` names the step classes a request may ask for by name (``sampler``). A new
sampler is a step class (``ConfiguredStep`` gives the schedule's counts and a predetermined ordering's choice)
with its own settings (``Settings``, ``steps.settings``) and cost (``work_kind``, ``work_scale``), and one
``register_step`` call, from anywhere."""

from ttcore.registry import Registry

from .base import ConfiguredStep, Step, WorkKind
from .block import BlockStep
from .chain_rule import ChainRuleStep
from .dcd import DCDStep
from .eb import EBStep
from .edlm import EDLMStep
from .fast_adaptive import FastAdaptiveStep
from .marginal_view import MarginalViewStep
from .predetermined import PredeterminedJointStep
from .settings import StepSettings, declared, setting

STEP_CLASSES: list[type[Step]] = [MarginalViewStep, FastAdaptiveStep, EBStep, ChainRuleStep, PredeterminedJointStep]
SAMPLERS = Registry("sampler")  # named samplers beyond the settings-chosen ones (``SamplerConfig.sampler``)
BUILT_IN = {"fixed": False, "eb": True}  # the API's built-in sampler names -> whether the request's eb_gamma applies


def register_step(name: str, cls: type[Step]) -> type[Step]:
    """Make ``cls`` the sampler a request selects with ``sampler: name`` (``ValueError`` if the name is taken,
    or its settings clash with another step's)."""
    if name in BUILT_IN:
        raise ValueError(f"sampler name {name!r} is taken by the built-in samplers")
    declared([*STEP_CLASSES, *SAMPLERS.values(), cls])  # its settings do not clash with another's
    return SAMPLERS.register(cls, name)


def unregister_step(name: str) -> None:
    """Forget a registered sampler and its settings (built-in names stay)."""
    SAMPLERS.unregister(name)


_DECLARED: dict = {}  # the step classes -> their settings (one entry: the registry as last read)


def step_settings() -> dict:
    """Every setting the step classes declare (built-in and registered): name -> (field, type, owner); read
    again only when the classes change (every SamplerConfig and request asks)."""
    classes = (*STEP_CLASSES, *SAMPLERS.values())
    if classes not in _DECLARED:
        _DECLARED.clear()
        _DECLARED[classes] = declared(classes)
    return _DECLARED[classes]


register_step("edlm", EDLMStep)  # EDLM (Xu et al. 2025) with an AR energy: over a diffusion model paired with an AR one
register_step("dcd", DCDStep)  # DCD (Liu et al. 2025) with an AR copula: likewise
register_step("blocks", BlockStep)  # block diffusion (BD3-LM): a block diffusion model's runs


def sampler_names() -> list[str]:
    """Every name a request's ``sampler`` may take: the built-in ones, then the registered."""
    return [*BUILT_IN, *SAMPLERS]


def named_sampler(name: str, eb_gamma: float | None) -> dict:
    """A request's ``sampler`` and ``eb_gamma`` as ``SamplerConfig`` settings: a built-in name selects by the
    settings (``eb``: with EB's bound; ``fixed``: without), a registered one by its name."""
    if name in BUILT_IN:
        return {"sampler": None, "eb_gamma": eb_gamma if BUILT_IN[name] else None}
    return {"sampler": name, "eb_gamma": None}


__all__ = ["SAMPLERS", "STEP_CLASSES", "BlockStep", "ChainRuleStep", "ConfiguredStep", "DCDStep", "EDLMStep", "EBStep",
           "FastAdaptiveStep", "MarginalViewStep", "PredeterminedJointStep", "Step", "StepSettings", "WorkKind",
           "named_sampler", "register_step", "sampler_names", "setting", "step_settings", "unregister_step"]
