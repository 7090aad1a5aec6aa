"""One generation request's sampler, frozen: what the request schemas build (``to_sampler_config``) and
``GenerationRun`` takes. It answers what admission and evaluation ask of a sampler (``step``: the step
class that draws each denoising step, and whether that step is adaptive or sums a format's full head
outputs), so no caller decides by the ordering's or the sampler's name."""

from dataclasses import asdict, dataclass, fields

from ttcore.decompositions import CONTRACTIONS
from ttcore.errors import InvalidSampler

from .eb import EB_PROXIES
from .orderings import ADAPTIVE, PREDETERMINED
from .schedules import SCHEDULES
from .steps import SAMPLERS, STEP_CLASSES, Step, WorkKind

MAX_DCD_CHUNK = 1024  # DCD's chunk of adjacent positions (a chunk past the length is the whole sequence)
MAX_EDLM_CANDIDATES = 16  # EDLM's k: each candidate is one more AR forward of the sequence a step
ADAPTIVE_PATHS = ("fast", "exact")  # the first is the default everywhere (library, API, playground)


@dataclass(frozen=True)
class SamplerConfig:
    """``ordering``: predetermined (random, left_to_right, halton) or adaptive (top_prob, margin, entropy);
    ``schedule``: tokens per step; ``eb_gamma``: EB-Sampler's bound (None: a fixed number of tokens per
    step); ``eb_proxy``: EB's error proxy; ``temperature``; ``contraction`` (TT: how positions outside a
    step's set are summed out); ``joint``: False draws each position from its exact marginal (the rank-1
    view); ``bernoulli``: per-position unmasking coins instead of exact counts; ``sampler``: a step class
    registered by name (``steps.register_step``), None: the built-in one the settings select;
    ``adaptive_path``: adaptive orderings and EB by the exact chain rule (``exact``, the reference) or with
    one marginal inference per step and a joint draw of the chosen set (``fast``, ``steps.fast_adaptive``);
    ``chooser_outputs``: the head outputs per masked position the fast path's choice evaluates (c; None: the
    default of ``steps.fast_adaptive.chooser_outputs``, about the cost of a random-order step; up to every
    output, which makes the choice's marginals those of the head's mixture: ``benchmarks/chooser_distance.py``);
    ``edlm_candidates`` (k) and ``edlm_window`` (w): ``sampler: edlm``'s proposals a step and the times it
    weighs them at (``steps.edlm``; the paper's k = 2 and the TT paper's w = 1); ``dcd_chunk``: ``sampler: dcd``
    with the random ordering unmasks chunks of that many adjacent positions (``steps.dcd``; 1, the TT paper's)."""
    ordering: str = "random"
    schedule: str = "loglinear"
    eb_gamma: float | None = None
    eb_proxy: str = "entropy"
    temperature: float = 1.0
    contraction: str = "head"
    joint: bool = True
    bernoulli: bool = False
    sampler: str | None = None
    adaptive_path: str = ADAPTIVE_PATHS[0]
    chooser_outputs: int | None = None
    edlm_candidates: int = 2
    edlm_window: float = 1.0
    dcd_chunk: int = 1

    def __post_init__(self):
        if self.chooser_outputs is not None and self.chooser_outputs < 1:
            raise InvalidSampler("chooser_outputs", f"chooser_outputs must be >= 1, got {self.chooser_outputs}")
        if not 1 <= self.edlm_candidates <= MAX_EDLM_CANDIDATES:
            raise InvalidSampler("edlm_candidates", f"edlm_candidates must lie in [1, {MAX_EDLM_CANDIDATES}], got "
                                                    f"{self.edlm_candidates}")
        if not 1 <= self.dcd_chunk <= MAX_DCD_CHUNK:
            raise InvalidSampler("dcd_chunk", f"dcd_chunk must lie in [1, {MAX_DCD_CHUNK}], got {self.dcd_chunk}")
        if self.dcd_chunk > 1 and (self.sampler != "dcd" or self.ordering != "random"):
            raise InvalidSampler("dcd_chunk", "dcd_chunk > 1 applies to sampler dcd with the random ordering")
        if not 0 < self.edlm_window <= 1:
            raise InvalidSampler("edlm_window", f"edlm_window must lie in (0, 1], got {self.edlm_window}")
        if self.adaptive_path not in ADAPTIVE_PATHS:
            raise InvalidSampler("adaptive_path", f"adaptive_path must be one of {', '.join(ADAPTIVE_PATHS)}, got "
                                                  f"{self.adaptive_path!r}")
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise InvalidSampler("sampler",
                                 f"sampler must be one of {sorted(SAMPLERS)} (or none), got {self.sampler!r}")
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
        # resolved once: the named step class, else the first of ``steps.STEP_CLASSES`` that accepts the settings
        cls = SAMPLERS[self.sampler] if self.sampler is not None else next(
            c for c in STEP_CLASSES if c.accepts(self))
        object.__setattr__(self, "_step", cls(self))
        key = tuple(getattr(self, f.name) for f in fields(self) if f.name != "temperature")
        object.__setattr__(self, "_batch_key", key + (self.temperature == 1.0,))

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
        return asdict(self)
