"""This machine's speed at each kind of work of a model (``Speed``), which admission (``service.admission``) prices
requests with and the engine corrects (``Speed.observe``).

A cost model of the work a step does, scaled by rates measured on this machine. Each kind of work of a checkpoint
(``WorkKind``: a predetermined step, a fast adaptive step, an exact-contraction step, a tempered joint step, the
chain rule's picks) is timed when a request first needs it (``Speed.ensure``: a few short timings, a second at most,
at one row and at a few rows) as a per-step overhead plus a cost per sequence, at one step that draws every position
(the dearest step of any run: an upper bound of a step at any step count); more chooser outputs than the default
scale the per-sequence cost up (``ttcore.sampling.cost.Work``); sequences beyond the timing's cost ``ROWS_GROWTH``
times more each. The model's figure is then multiplied by a measured ratio: the slowest of the last ``WINDOW``
requests of that kind, as what it took over what the model said. A ratio of two positive times never falls to zero,
and the slowest recent one makes the estimate an upper bound of what recent requests took, not their middle. A kind
whose only figure is a timing (no request measured it) and that refuses a request is re-timed afterwards, in the
background (``Serving.retime``), so a timing taken on a busy machine cannot refuse requests for ever and no stranger
waits for it."""

import math
import time
from collections import deque

from ttcore.distributions.streams import warm_streams
from ttcore.errors import InvalidSampler
from ttcore.sampling import GenerationRun, SamplerConfig
from ttcore.sampling.cost import Work, reference_automaton
from ttcore.sampling.steps import WorkKind

WINDOW = 8  # requests per kind of work whose slowest ratio (measured / modelled) scales the model
CALIBRATION_REPEATS = 3  # best of this many short timings
CALIBRATION_ROWS = 64  # the most rows of the batched timing (a step of n rows costs overhead + n x per-row)
CALIBRATION_STEP_S = 0.1  # the batched timing takes fewer rows (at least 2) when one row already takes this long
CALIBRATION_SLOW_S = 1.0  # a one-row step this long is timed once, at one row only (its overhead is negligible)
CALIBRATION_STEPS = 1  # the timed run's step count: one step draws every position, the dearest step of any run
RECALIBRATE_EVERY_S = 60.0  # an unmeasured kind is re-timed after a refusal at most this often
ROWS_GROWTH = 1.3  # a sequence beyond the timed rows costs this much more (caches: QM9 TT 64 -> 256 rows 1.13x)
WALL_HEADROOM = 1.25  # a deadline holds this much more than the estimate: the wall time outside compute (queue,
# decoding, the event loop: 4-7% measured) and the model's error (a step of 3x the timed rows: up to 1.2x the model)


class Speed:
    """Seconds on this machine of each kind of work (``WorkKind``) of one model: the cost model and its
    measured ratio (module docstring).

    ``timing[kind]`` is ``(overhead, per_row)`` of one step, from ``calibrate_kinds`` (a step of n sequences
    is ``overhead + n x per_row``: a step of 256 rows is not 256 one-row steps); the chain rule's is
    ``(0, its picks' seconds per sequence over a whole run)``, and its steps are predetermined steps. Kinds are
    timed when a request first needs them (``ensure``, on the model's worker), not at start-up, so a server
    starts in seconds whatever it serves; a timing is the best of a few (a busy machine only slows a timing
    down) and costs at most about a second. Every request the engine runs adds one ratio when it finishes or
    its deadline passes (``observe``); the estimate is the model times the largest of the last ``WINDOW``
    ratios of the kind (1 before any request)."""

    KINDS = tuple(WorkKind)

    def __init__(self, timing: dict[WorkKind, tuple] | None = None):
        self.timing: dict[WorkKind, tuple[float, float, float]] = {}  # (overhead, per row, rows timed)
        for k, v in (timing or {}).items():
            self.timing[WorkKind(k)] = (*v, math.inf) if len(v) == 2 else tuple(v)
        self._ratios = {k: deque(maxlen=WINDOW) for k in self.KINDS}
        self._recalibrated: dict[WorkKind, float] = {}  # kind -> when it was last re-timed (time.monotonic)

    @classmethod
    def lazy(cls) -> "Speed":
        """No kind timed yet: each is timed when a request first needs it (``ensure``)."""
        return cls()

    def _step_kind(self, kind: WorkKind) -> WorkKind:
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        return WorkKind.predetermined_step if kind == WorkKind.chain_rule else WorkKind(kind)

    def timed(self, kind: WorkKind) -> bool:
        """Whether the kind has a timing."""
        return kind in self.timing

    def needs(self, kind: WorkKind) -> list[WorkKind]:
        """The kinds an estimate of ``kind`` reads (a chain-rule run's steps are predetermined steps) that have
        no timing yet."""
        wanted = {self._step_kind(kind)} | ({WorkKind.chain_rule} if kind == WorkKind.chain_rule else set())
        return sorted(k for k in wanted if not self.timed(k))

    def ensure(self, model, kind: WorkKind) -> None:
        """Time what an estimate of ``kind`` needs and does not have yet (``calibrate_kinds``; on the model's
        worker, or wherever the model may run)."""
        missing = self.needs(kind)
        if missing:
            for k, timing in calibrate_kinds(model, missing).items():
                self.timing.setdefault(k, timing)
                self._recalibrated[k] = time.monotonic()

    def margin(self, kind: WorkKind, rows: int | None = None) -> float:
        """What recent requests of this kind took over what the model said, for a run of ``rows`` sequences:
        the largest of the last ``WINDOW`` ratios, where a ratio below 1 (a request faster than the model)
        counts only from a request of at least ``rows`` sequences (a small request's speed says little of a
        large one's: the model's split of overhead and per-row cost is only as good as its timing); 1 when no
        ratio counts. None: every ratio counts."""
        return max((r for r, n in self._ratios[kind] if r >= 1 or rows is None or n >= rows), default=1.0)

    def _modelled(self, kind: WorkKind, rows: int, steps: float, overhead_steps: float, scale: float) -> float:
        """The model's seconds (no margin) of ``steps`` steps over ``rows`` sequences, charged the steps'
        overhead ``overhead_steps`` times, plus a chain-rule run's picks."""
        overhead, per_row, timed = self.timing[self._step_kind(kind)]
        picks = rows * self.timing[WorkKind.chain_rule][1] if kind == WorkKind.chain_rule else 0.0
        weighed = min(rows, timed) + ROWS_GROWTH * max(rows - timed, 0)  # rows beyond the timing's cost more
        return overhead * overhead_steps + weighed * steps * per_row * scale + picks

    def step_seconds(self, kind: WorkKind, rows: int = 1, scale: float = 1.0) -> float:
        """One step of a run of this kind over ``rows`` sequences, margin included (a chain-rule run's steps
        are predetermined steps at the chain rule's margin; its picks are ``chain_seconds``)."""
        step_kind = WorkKind.predetermined_step if kind == WorkKind.chain_rule else kind
        return self.margin(kind, rows) * self._modelled(step_kind, rows, 1, 1, scale)

    def overhead_seconds(self, kind: WorkKind, rows: int | None = None) -> float:
        """The per-step overhead of a run of this kind (a pass of a micro-batched step pays it again), margin
        included."""
        return self.margin(kind, rows) * self.timing[self._step_kind(kind)][0]

    def chain_seconds(self, rows: int = 1) -> float:
        """A chain-rule run's picks over ``rows`` sequences, a whole run's, margin included."""
        return self.margin(WorkKind.chain_rule, rows) * rows * self.timing[WorkKind.chain_rule][1]

    def timed_rows(self, kind: WorkKind) -> int | None:
        """The sequences a step kind's timing ran in one step: a larger step's sequences beyond these cost
        ``ROWS_GROWTH`` times the per-row figure (None: a timing given without its rows, which never grows)."""
        rows = self.timing[self._step_kind(kind)][2]
        return int(rows) if math.isfinite(rows) else None

    def estimate(self, kind: WorkKind) -> float:
        """Seconds per sequence of a kind at one sequence, margin included: a step's (the chain rule: a whole
        run's picks)."""
        return self.margin(kind, 1) * self.timing[kind][1]

    def unmeasured(self, kind: WorkKind) -> bool:
        """Whether no request of this kind has been measured yet (only its timing speaks)."""
        return not self._ratios[kind]

    def observe(self, work: Work | WorkKind, *, rows: int, steps: int, seconds: float,
                overhead_steps: float | None = None) -> None:
        """A request of this work that ran ``steps`` engine steps over ``rows`` sequences and was charged
        ``seconds`` of compute (its shares of the batched steps it was part of). ``overhead_steps``: the steps'
        overhead it was charged, in steps (its share of each step's sequences, summed; default: ``steps``, as
        when it ran alone). Adds the ratio of ``seconds`` to the model's figure."""
        if not isinstance(work, Work):
            self._step_kind(work)  # a known kind, or ValueError naming them
            work = Work(WorkKind(work))
        if rows <= 0 or steps <= 0 or not math.isfinite(seconds) or seconds <= 0 or self.needs(work.kind):
            return
        modelled = self._modelled(work.kind, rows, steps, steps if overhead_steps is None else overhead_steps,
                                  work.scale)
        if modelled > 0:
            self._ratios[work.kind].append((seconds / modelled, rows))

    def may_recalibrate(self, kind: WorkKind) -> bool:
        """Whether a refusal of this kind should re-time it: no request has measured it, and it was not
        timed in the last ``RECALIBRATE_EVERY_S``."""
        last = self._recalibrated.get(kind)
        return self.unmeasured(kind) and (last is None or time.monotonic() - last > RECALIBRATE_EVERY_S)

    def mark_recalibrating(self, kind: WorkKind) -> None:
        """A re-timing of ``kind`` is on its way: ``may_recalibrate`` says no until ``RECALIBRATE_EVERY_S``."""
        self._recalibrated[kind] = time.monotonic()

    def recalibrate(self, model, kind: WorkKind) -> None:
        """Re-time one kind as ``ensure`` does and replace its timing (on the model's worker; a second at most
        for the bundled models). Kinds that requests measured keep their timing (a chain rule re-times its
        steps too)."""
        self._recalibrated[kind] = time.monotonic()
        for k, timing in calibrate_kinds(model, [kind]).items():
            if k == kind or self.unmeasured(k):
                self.timing[k] = timing


def _best(model, n: int, steps: int, repeats: int = CALIBRATION_REPEATS, constraint=None, **settings) -> float:
    """The shortest of up to ``repeats`` timings of one step of a fresh run of ``n`` sequences (the shortest: a
    busy machine only ever slows a timing down); one only when a step takes ``CALIBRATION_SLOW_S`` or more."""
    times = []
    # the kind's way to time a step (``ModelKind.calibration``: a cached kind's mean step over a whole run)
    settings, steps, whole_run = model.cfg.kind.calibration(settings, steps, model.cfg)
    for _ in range(repeats):
        run = GenerationRun(model, n, steps, SamplerConfig(**settings), seed=0, constraint=constraint)
        t0, taken = time.perf_counter(), 0
        with model.compute_context():
            while not taken or (whole_run and not run.done):
                run.step()
                taken += 1
        times.append((time.perf_counter() - t0) / taken)
        if times[-1] >= CALIBRATION_SLOW_S:
            break
    return min(times)


def _affine(model, repeats: int, **settings) -> tuple[float, float, int]:
    """(overhead, per row, rows timed) of one step at ``CALIBRATION_STEPS`` steps, from a one-row timing and one of a
    few rows (``CALIBRATION_ROWS``, fewer when a row takes long: at least 2); a kind whose one-row step takes
    ``CALIBRATION_SLOW_S`` or more (the bundled text TT at a temperature: 0.3-3.5 s) is timed once at one row,
    its whole step taken as per-row cost (an upper bound: no overhead is split off, and rows beyond one cost
    ``ROWS_GROWTH`` times more), so its first request waits one such step, not several."""
    one = _best(model, 1, CALIBRATION_STEPS, repeats, **settings)
    if one >= CALIBRATION_SLOW_S:
        return 0.0, one, 1
    rows = max(2, min(CALIBRATION_ROWS, int(CALIBRATION_STEP_S / max(one, 1e-9))))
    many = _best(model, rows, CALIBRATION_STEPS, repeats, **settings)
    per_row = max(many - one, 0.0) / (rows - 1) or many / rows
    return max(one - per_row, 0.0), per_row, rows


FAST = dict(ordering="top_prob", adaptive_path="fast")
TIMED_WITH = {  # each kind of step work -> the settings its timing runs and its repeats (the tempered at T = 0.5)
    WorkKind.predetermined_step: ({}, CALIBRATION_REPEATS),
    WorkKind.exact_step: ({"contraction": "exact"}, 2),
    WorkKind.chooser_step: (FAST, CALIBRATION_REPEATS),
    WorkKind.tempered_step: ({"temperature": 0.5}, 2),
    WorkKind.tempered_chooser_step: ({"temperature": 0.5, **FAST}, 2),
    WorkKind.constrained_step: ({}, 2),  # with ``reference_automaton``
    WorkKind.edlm_step: ({"sampler": "edlm"}, 2),
    WorkKind.dcd_step: ({"sampler": "dcd"}, 2),
}


def _timing(model, kind: WorkKind, out: dict) -> tuple[float, float, int]:
    """One kind's timing (``TIMED_WITH``). A kind this model cannot run (EDLM and DCD without an AR pair: their
    requests are refused) or that runs as the plain step here (``exact`` on a format without that contraction)
    takes the predetermined step's timing."""
    settings, repeats = TIMED_WITH[kind]
    plain = kind == WorkKind.exact_step and "exact" not in model.format.contractions
    if not plain:
        try:
            constraint = reference_automaton(model.cfg.dit.out_vocab) if kind == WorkKind.constrained_step else None
            return _affine(model, repeats, constraint=constraint, **settings)
        except InvalidSampler:
            if kind == WorkKind.predetermined_step:  # every model runs the plain step
                raise
    if WorkKind.predetermined_step not in out:
        out[WorkKind.predetermined_step] = _timing(model, WorkKind.predetermined_step, out)
    return out[WorkKind.predetermined_step]


def calibrate_kinds(model, kinds) -> dict[WorkKind, tuple[float, float, float]]:
    """(overhead, per row, rows timed) of each kind in ``kinds`` (chain_rule: (0, its per-sequence picks, inf)),
    timed after a warm-up step; a chain-rule estimate needs the predetermined step's timing and takes it too."""
    warm_streams(next(model.parameters()).device)  # compiled streams (on CUDA) compile here, not in a timing
    _best(model, 1, CALIBRATION_STEPS, 1)  # warm-up: allocator, kernels
    out = {}
    wanted = set(kinds) | ({WorkKind.predetermined_step} if WorkKind.chain_rule in kinds else set())
    for kind in sorted(wanted - {WorkKind.chain_rule}, key=lambda k: (k != WorkKind.predetermined_step, k)):
        out[kind] = out.get(kind) or _timing(model, kind, out)
    if WorkKind.chain_rule in kinds:
        l = model.cfg.dit.length
        step = _best(model, 1, l, CALIBRATION_REPEATS)  # a predetermined step of an l-step run: one position
        first_pick = max(_best(model, 1, l, 2, ordering="top_prob", adaptive_path="exact") - step, 0.0)
        out[WorkKind.chain_rule] = (0.0, l * first_pick / 2, math.inf)
    return out


def calibrate(model) -> Speed:
    """Every kind timed now (the service times each when first needed: ``Speed.lazy``, ``Speed.ensure``).
    The chain rule is not run to the end (a text model's picks take many seconds): one pick is timed and the
    whole is taken as l picks at half that cost each (the picks shrink as positions are conditioned; measured
    at text size the whole was 0.29 of l first picks, at QM9 size 0.6). Approximate by construction: the
    ratios of measured requests correct it."""
    return Speed(calibrate_kinds(model, Speed.KINDS))
