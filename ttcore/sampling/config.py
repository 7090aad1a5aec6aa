"""One generation request's sampler, frozen: what the request schemas build (``to_sampler_config``) and
``GenerationRun`` takes. It answers what admission and evaluation ask of a sampler (``step``: the step
class that draws each denoising step, and whether that step is adaptive or sums a format's full head
outputs), so no caller decides by the ordering's or the sampler's name."""

from dataclasses import dataclass, fields

from ttcore.decompositions import CONTRACTIONS
from ttcore.errors import InvalidSampler

from .eb import EB_PROXIES
from .orderings import ADAPTIVE, PREDETERMINED
from .schedules import SCHEDULES
from .steps import SAMPLERS, STEP_CLASSES, Step, WorkKind, step_settings
from .steps.settings import check_bounds

ADAPTIVE_PATHS = ("fast", "exact")  # the first is the default everywhere (library, API, playground)


@dataclass(frozen=True, init=False)
class SamplerConfig:
    """What every sampler shares, and each step class's own settings (``options``).

    Built from flat settings, ``SamplerConfig(ordering="top_prob", chooser_outputs=8)``: a name that is not a
    field here must be a setting some step class declares (``Step.Settings``: EDLM's ``edlm_candidates`` and
    ``edlm_window``, DCD's ``dcd_chunk``, the fast adaptive step's ``chooser_outputs``); each is checked against
    its declared bounds, and the step that draws reads its own (``Step.settings``)."""
    ordering: str = "random"  # predetermined (random, left_to_right, halton) or adaptive (top_prob, margin, entropy)
    schedule: str = "loglinear"  # tokens per step
    eb_gamma: float | None = None  # EB-Sampler's bound; None: a fixed number of tokens per step
    eb_proxy: str = "entropy"  # EB's error proxy
    temperature: float = 1.0
    contraction: str = "head"  # TT: how positions outside a step's set are summed out
    joint: bool = True  # False: each position from its exact marginal (the rank-1 view)
    bernoulli: bool = False  # per-position unmasking coins instead of exact counts
    sampler: str | None = None  # a step class registered by name (steps.register_step); None: chosen by the settings
    adaptive_path: str = ADAPTIVE_PATHS[0]  # adaptive orderings and EB: the exact chain rule, or fast (one
    # marginal inference a step, then a joint draw of the chosen set: steps.fast_adaptive)
    options: tuple = ()  # the step classes' own settings that differ from their defaults, (name, value) by name

    def __init__(self, **settings):
        declared = step_settings()
        given = dict(settings.pop("options", ()))
        for f in fields(self):
            if f.name != "options":
                object.__setattr__(self, f.name, settings.pop(f.name, f.default))
        given.update(settings)
        unknown = sorted(set(given) - set(declared))
        if unknown:
            shared = ", ".join(f.name for f in fields(self) if f.name != "options")
            raise TypeError(f"SamplerConfig got settings no step class declares: {', '.join(unknown)} (shared: "
                            f"{shared}; declared: {', '.join(declared)})")
        for name, value in given.items():
            check_bounds(declared[name][0], value)
        options = tuple(sorted((k, v) for k, v in given.items() if v != declared[k][0].default))
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "_options", dict(options))
        self.__post_init__()

    def __post_init__(self):
        if self.adaptive_path not in ADAPTIVE_PATHS:
            raise InvalidSampler("adaptive_path", f"adaptive_path must be one of {', '.join(ADAPTIVE_PATHS)}, got "
                                                  f"{self.adaptive_path!r}")
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise InvalidSampler("sampler", f"sampler must be one of {', '.join(SAMPLERS)} (or none), got "
                                            f"{self.sampler!r}")
        if self.ordering not in PREDETERMINED and self.ordering not in ADAPTIVE:
            raise InvalidSampler("ordering", f"ordering must be one of {sorted(PREDETERMINED) + sorted(ADAPTIVE)}, got "
                             f"{self.ordering!r}")
        if self.schedule not in SCHEDULES:
            raise InvalidSampler("schedule", f"schedule must be one of {sorted(SCHEDULES)}, got {self.schedule!r}")
        if self.eb_gamma is not None and self.eb_gamma < 0:
            raise InvalidSampler("eb_gamma", f"eb_gamma must be >= 0, got {self.eb_gamma}")
        if self.eb_proxy not in EB_PROXIES:
            raise InvalidSampler("eb_proxy", f"eb_proxy must be one of {sorted(EB_PROXIES)}, got {self.eb_proxy!r}")
        if not self.temperature > 0:
            raise InvalidSampler("temperature", f"temperature must be > 0, got {self.temperature}")
        if self.contraction not in CONTRACTIONS:
            raise InvalidSampler("contraction",
                                 f"contraction must be one of {list(CONTRACTIONS)}, got {self.contraction!r}")
        if not self.joint and self.eb_gamma is not None:
            raise InvalidSampler("joint", "joint: false draws each position from its marginal with a fixed sampler, "
                                          "not eb")
        for owner in {owner for name, (_, _, owner) in step_settings().items() if name in self._options}:
            owner.of(self).check(self)  # rules across a step's settings and the shared ones
        # resolved once: the named step class, else the first of ``steps.STEP_CLASSES`` that accepts the settings
        cls = SAMPLERS[self.sampler] if self.sampler is not None else next(
            c for c in STEP_CLASSES if c.accepts(self))
        object.__setattr__(self, "_step", cls(self))
        key = tuple(getattr(self, f.name) for f in fields(self) if f.name != "temperature")
        object.__setattr__(self, "_batch_key", key + (self.temperature == 1.0,))

    def option(self, name: str):
        """A step setting's value in this config: the run's, else its declared default."""
        declared = step_settings()
        if name not in declared:
            raise KeyError(f"no step class declares a setting {name!r} (declared: {', '.join(declared)})")
        return self._options.get(name, declared[name][0].default)

    @property
    def step(self) -> Step:
        """The step that draws each denoising step with these settings: its counts, choice and draw."""
        return self._step

    @property
    def batch_key(self) -> tuple:
        """Runs with equal keys step as one group (``batch_step``): every setting but the temperature, which
        travels per sequence (``Rows.temperature``); 1 and other temperatures do not mix (at another
        temperature a TT step sums the cores exactly)."""
        return self._batch_key

    def step_kind(self, model_cfg) -> tuple[bool, bool]:
        """``(adaptive, exact)`` of its steps on a model: adaptive steps hold every position's full head
        outputs per sequence; exact ones sum a format's full head outputs (``Decomposition.sums_exactly``) or
        hold them for some rows at once (``Step.sums_outputs``: EDLM over a joint head)."""
        adaptive = self.step.adaptive
        exact = model_cfg.format.sums_exactly(self.contraction, self.temperature, self.joint, adaptive) or \
            self.step.sums_outputs(model_cfg.format, self.temperature)
        return adaptive, exact

    def work_kind(self, model_cfg) -> WorkKind:
        """What one step costs on a model, as admission times it (``Step.work_kind``)."""
        return self.step.work_kind(model_cfg.format)

    def to_dict(self) -> dict:
        """The flat settings (shared ones and the step settings given) that rebuild this config."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}, **self._options}
