"""Admission by cost: each request's memory and compute are estimated before it is admitted.

Memory: ``ttcore.sampling.cost`` gives the bytes one step holds per sequence (from the model's shape);
a request larger than the memory budget is drawn in micro-batches of sequences (``max_rows_per_pass``),
so its peak stays under the budget whatever ``num_samples`` is.

Compute: a cost model of the work a step does, scaled by rates measured on this machine (``Speed``). Each
kind of work of a checkpoint (``WorkKind``: a predetermined step, a fast adaptive step, an exact-contraction
step, a tempered joint step, the chain rule's picks) is timed when a request first needs it
(``Speed.ensure``: a few short timings, a second at most, at one row and at a few rows) as a per-step
overhead plus a cost per sequence, at one step that draws every position (the dearest step of any run: an
upper bound of a step at any step count); more chooser outputs than the default scale the per-sequence cost
up (``Work``).
The model's figure is then multiplied by a measured ratio: the slowest of the last ``WINDOW`` requests of
that kind, as what it took over what the model said. A ratio of two positive times never falls to zero, and
the slowest recent one makes the estimate an upper bound of what recent requests took, not their middle. A
request's estimate is steps x (overhead + sequences x step cost) + sequences x chain-rule time, margin
included (sequences beyond the timing's cost ``ROWS_GROWTH`` times more each); with ``WALL_HEADROOM`` for
what a request spends outside compute it must fit the request's deadline, and its longest step must fit the
step limit (half the stall
limit that ``/health`` watches). A request that cannot fit gets a 422 naming a setting that would (the
largest ``num_samples`` or ``steps``, rounded down to a coarse grid so the hint holds while the estimate
moves a little), checked by this same rule. A kind whose only figure is a timing (no request measured it)
and that refuses a request is re-timed afterwards, in the background, so a timing taken on a busy machine
cannot refuse requests for ever and no stranger waits for it."""

import math
import time
from collections import deque
from dataclasses import dataclass

from ttcore.distributions.streams import warm_streams
from ttcore.sampling import GenerationRun, SamplerConfig, cost
from ttcore.sampling.steps import WorkKind

from .refusals import TooLarge

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


@dataclass(frozen=True)
class Work:
    """A request's kind of work and ``scale``, its settings' per-sequence step cost relative to the timed
    step's (``work_of``)."""
    kind: WorkKind
    scale: float = 1.0


def work_of(model_cfg, config: SamplerConfig, steps: int) -> Work:
    """The work of a run with ``config`` at ``steps`` steps: its kind, scaled up by the chooser outputs it asks
    beyond the default (the fast step's choice evaluates c head outputs per position): an upper bound, since the
    backbone's share of a step does not grow with c. The step count needs no scale: the timing's run takes one
    step, the most positions a step can draw (``CALIBRATION_STEPS``)."""
    from ttcore.sampling.steps.fast_adaptive import chooser_outputs  # the step module owns c

    kind, scale = config.work_kind(model_cfg), 1.0
    if kind in (WorkKind.chooser_step, WorkKind.tempered_chooser_step) and config.chooser_outputs is not None:
        e, v = model_cfg.format.outputs_per_position(model_cfg.rank), model_cfg.dit.out_vocab
        scale = max(1.0, chooser_outputs(e, v, config.chooser_outputs) / chooser_outputs(e, v))
    return Work(kind, scale)


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
        work = work if isinstance(work, Work) else Work(self._step_kind(work) if work != WorkKind.chain_rule
                                                        else WorkKind.chain_rule)
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


def _best(model, n: int, steps: int, repeats: int = CALIBRATION_REPEATS, **settings) -> float:
    """The shortest of up to ``repeats`` timings of one step of a fresh run of ``n`` sequences (the shortest: a
    busy machine only ever slows a timing down); one only when a step takes ``CALIBRATION_SLOW_S`` or more."""
    times = []
    for _ in range(repeats):
        run = GenerationRun(model, n, steps, SamplerConfig(**settings), seed=0)
        t0 = time.perf_counter()
        with model.compute_context():
            run.step()
        times.append(time.perf_counter() - t0)
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


def calibrate_kinds(model, kinds) -> dict[WorkKind, tuple[float, float, float]]:
    """(overhead, per row, rows timed) of each kind in ``kinds`` (chain_rule: (0, its per-sequence picks, inf)),
    timed after a
    warm-up step; a chain-rule estimate needs the predetermined step's timing and takes it too. The tempered
    steps are timed at temperature 0.5."""
    warm_streams(next(model.parameters()).device)  # compiled streams (on CUDA) compile here, not in a timing
    _best(model, 1, CALIBRATION_STEPS, 1)  # warm-up: allocator, kernels
    fast = dict(ordering="top_prob", adaptive_path="fast")
    out = {}
    if WorkKind.predetermined_step in kinds or WorkKind.chain_rule in kinds:
        out[WorkKind.predetermined_step] = _affine(model, CALIBRATION_REPEATS)
    if WorkKind.exact_step in kinds:
        has_exact = "exact" in model.format.contractions
        out[WorkKind.exact_step] = _affine(model, 2, contraction="exact") if has_exact else \
            out.get(WorkKind.predetermined_step) or _affine(model, CALIBRATION_REPEATS)
    if WorkKind.chooser_step in kinds:
        out[WorkKind.chooser_step] = _affine(model, CALIBRATION_REPEATS, **fast)
    if WorkKind.tempered_step in kinds:
        out[WorkKind.tempered_step] = _affine(model, 2, temperature=0.5)
    if WorkKind.tempered_chooser_step in kinds:
        out[WorkKind.tempered_chooser_step] = _affine(model, 2, temperature=0.5, **fast)
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


def _round_down(n: int) -> int:
    """A hint that stays put while the estimate moves a little: two significant digits from 100 up (152 and 151
    both say 150), a multiple of 5 from 10 to 99 (22 and 20 both say 20), rounded down."""
    if n < 10:
        return n
    if n < 100:
        return n // 5 * 5
    scale = 10 ** (len(str(n)) - 2)
    return n // scale * scale


@dataclass
class Plan:
    """What admission decided: the micro-batch size and the estimated compute."""
    max_rows_per_pass: int | None
    seconds: float  # estimated compute of the whole request
    step_seconds: float  # estimated compute of its longest step


def _largest(fits, below: int) -> int:
    """The largest n in [1, below) with fits(n) (fits is monotone: True up to some n), or 0."""
    lo, hi = 0, below  # fits(lo) holds (or lo = 0); fits(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan(model, speed: Speed, *, num_samples: int, steps: int, config: SamplerConfig, timeout_s: float,
         memory_budget: int, step_limit_s: float) -> Plan:
    """Micro-batching and compute estimate of a request sampled with ``config``, or TooLarge naming what to
    lower."""
    cfg = model.cfg
    adaptive, exact = config.step_kind(cfg)
    chooses = config.step.chooses  # the fast path's choice (at temperature != 1 too)
    rows = cost.rows_per_pass(cfg, adaptive, memory_budget, exact, chooses, config.chooser_outputs)
    if rows == 0:
        need = cost.step_row_bytes(cfg, adaptive, chooses, config.chooser_outputs) >> 20
        raise TooLarge("ordering", f"one sequence of this model needs about {need} MB per step with this "
                                   f"ordering, above the server's memory budget of {memory_budget >> 20} MB; "
                                   "use a predetermined ordering (random, left_to_right, halton)")
    l = cfg.dit.length

    def estimate(n: int, k: int) -> tuple[float, float]:
        """(the whole run, its longest step) of n sequences at ``k`` steps, margin included; idle steps cost
        nothing; a step of more than ``rows`` sequences runs in passes, each with the step's overhead."""
        k = min(k, l)
        work = work_of(cfg, config, k)
        step = speed.step_seconds(work.kind, n, work.scale) + speed.overhead_seconds(work.kind, n) * (
            math.ceil(n / rows) - 1)
        chain = speed.chain_seconds(n) if adaptive else 0.0
        return k * step + chain, step + chain * math.ceil(l / k) / l  # a step makes <= ceil(l/k) picks

    def fits(n: int, k: int) -> bool:
        whole, step = estimate(n, k)
        return whole * WALL_HEADROOM <= timeout_s and step <= step_limit_s

    seconds, step_seconds = estimate(num_samples, steps)
    micro = rows if rows < num_samples else None
    if fits(num_samples, steps):
        return Plan(micro, seconds, step_seconds)
    fit = _largest(lambda n: fits(n, steps), num_samples)
    if fit >= 1:
        raise TooLarge("num_samples", f"this setting needs about {seconds:.3g} s of compute here (one step "
                                      f"about {step_seconds:.3g} s); within timeout_s {timeout_s:g} and "
                                      f"the {step_limit_s:g} s step limit, num_samples can be at most "
                                      f"{_round_down(fit)}", compute=True)
    for n in (num_samples, 1):  # a step count that fits, the largest below the one asked
        k = next((k for k in range(min(steps, l), 0, -1) if fits(n, k)), None)
        if k is not None:
            with_n = "" if n == num_samples else " with num_samples 1"
            raise TooLarge("steps", f"one sequence needs about {estimate(1, steps)[0]:.3g} s here, more than fits "
                                    f"timeout_s {timeout_s:g} and the {step_limit_s:g} s step limit; use at most "
                                    f"{_round_down(k)} steps{with_n}", compute=True)
    whole, step = estimate(1, l)
    if step > step_limit_s:  # the step limit refused, not the deadline: name what changes a step's work
        raise TooLarge("ordering" if adaptive else "model",
                       f"one step of one sequence needs about {step:.3g} s here, above the server's step limit "
                       f"of {step_limit_s:g} s (--max-step-s), at any num_samples, steps or timeout_s"
                       + ("; use a predetermined ordering (random, left_to_right, halton)" if adaptive
                          else "; this model's steps do not fit this server"), compute=True)
    raise TooLarge("timeout_s", f"no num_samples or steps fits timeout_s {timeout_s:g} here: one sequence at "
                                f"one step needs about {estimate(1, 1)[0]:.3g} s"
                                + ("; use a predetermined ordering (random, left_to_right, halton)"
                                   if adaptive else ""), compute=True)


def check_passes(sequences: int, draws: int, rows: int, pass_seconds, timeout_s: float, step_limit_s: float,
                 mode: str) -> float:
    """Scoring's admission: ``draws`` rounds over ``sequences``, each in pieces of at most ``rows`` sequences,
    a piece of n sequences taking ``pass_seconds(n)``; the whole must fit the deadline and the largest
    piece the step limit. -> estimated seconds, or TooLarge naming the field to lower and the rule that
    refused (the deadline, ``timeout_s``, or the step limit, the server's ``--max-step-s``)."""
    def total(n: int, d: int) -> float:
        full, rest = divmod(n, rows)
        return d * (full * pass_seconds(rows) + (pass_seconds(rest) if rest else 0.0))

    seconds, piece = total(sequences, draws), pass_seconds(min(rows, sequences))
    if seconds <= timeout_s and piece <= step_limit_s:
        return seconds
    if piece > step_limit_s:  # the step limit refused: fewer sequences per pass is what helps
        fit = _largest(lambda n: pass_seconds(n) <= step_limit_s, min(rows, sequences))
        raise TooLarge("sequences", f"one pass over {min(rows, sequences)} sequences needs about {piece:.3g} s here, "
                                    f"above the server's step limit of {step_limit_s:g} s (--max-step-s: no piece "
                                    f"of work may hold the model's worker longer); "
                                    + (f"at most {_round_down(fit)} sequences fit it" if fit >= 1 else
                                       "even one sequence does not: send shorter sequences"))
    fit_draws = int(timeout_s / total(sequences, 1))
    if mode == "elbo" and fit_draws >= 1:
        raise TooLarge("num_mc", f"{sequences} sequences x {draws} draws need about {seconds:.3g} s of compute "
                                 f"here, more than timeout_s {timeout_s:g}; num_mc can be at most {fit_draws}")
    fit = _round_down(_largest(lambda n: total(n, draws) <= timeout_s, sequences))
    raise TooLarge("sequences", f"{sequences} sequences x {draws} passes need about {seconds:.3g} s of compute "
                                f"here, more than timeout_s {timeout_s:g}; at most {fit} sequences fit"
                                + ("" if fit >= 1 else ": use a longer timeout_s"))


# A streamed answer's size, per position of every sequence in every step event: the partial sequence's text (a
# masked position is "[MASK]", 6 bytes, more than a SMILES symbol or an average BPE token takes) and, with
# step_tokens, the position's piece as a JSON string ('"[MASK]",': 9 bytes); per sequence in every event, the
# envelope around it (/v1's chunk per choice: id, model, object, index, the step and committed positions, about
# 300 bytes). A stream sends an event only for a step that committed a position (idle steps send nothing), so
# at most min(steps, length) step events, plus the final answer (counted as one more event). An estimate: the
# transports also count the bytes they send and end a stream at the limit (``StreamBudget``).
STREAM_BYTES_PER_POSITION, STEP_TOKEN_BYTES_PER_POSITION, STREAM_BYTES_PER_SEQUENCE = 6, 9, 320


def stream_bytes(num_samples: int, steps: int, length: int, step_tokens: bool, rounds: int = 1) -> int:
    """An estimate of a streamed answer in bytes: ``rounds`` x (min(steps, length) step events and the final
    answer), each with every sequence at every position and its envelope."""
    per_position = STREAM_BYTES_PER_POSITION + (STEP_TOKEN_BYTES_PER_POSITION if step_tokens else 0)
    return rounds * (min(steps, length) + 1) * num_samples * (length * per_position + STREAM_BYTES_PER_SEQUENCE)


class StreamBudget:
    """What a stream may still send (``--max-stream-mb``): the transports count every event's bytes, and the one
    that would pass the limit is not sent (the stream ends with an error naming the limit instead), so the
    limit holds whatever the estimate said."""

    def __init__(self, limit_bytes: int):
        self.limit, self.sent = limit_bytes, 0

    def allows(self, data: bytes, reserve: int = 0) -> bool:
        """Count ``data`` as sent when it fits with ``reserve`` bytes left for the closing event."""
        if self.sent + len(data) + reserve > self.limit:
            return False
        self.sent += len(data)
        return True

    def message(self) -> str:
        return (f"the stream reached the server's limit of {self.limit / 2**20:g} MB (--max-stream-mb) after "
                f"{self.sent:,} bytes; ask with fewer samples or steps, without step_tokens, or without stream")


def check_stream(num_samples: int, steps: int, length: int, step_tokens: bool, rounds: int, limit_bytes: int) -> int:
    """A streamed answer must fit ``limit_bytes`` (``--max-stream-mb``) -> its estimate, or TooLarge naming
    ``step_tokens`` when the answer fits without them, else the largest ``num_samples``, else ``steps``."""
    size = stream_bytes(num_samples, steps, length, step_tokens, rounds)
    if size <= limit_bytes:
        return size
    said = f"a stream of about {size / 2**20:.3g} MB ({rounds * min(steps, length)} step events and " \
           f"{'answers' if rounds > 1 else 'the answer'}, of {num_samples} sequences of {length} positions)"
    limit = f"the server's stream limit of {limit_bytes / 2**20:g} MB (--max-stream-mb)"
    if step_tokens and stream_bytes(num_samples, steps, length, False, rounds) <= limit_bytes:
        raise TooLarge("step_tokens", f"{said} is above {limit}; without step_tokens it fits")
    fit = _largest(lambda n: stream_bytes(n, steps, length, step_tokens, rounds) <= limit_bytes, num_samples)
    if fit >= 1:
        raise TooLarge("num_samples", f"{said} is above {limit}; num_samples can be at most {_round_down(fit)}, "
                                      "or ask without stream for the final answer only")
    k = _largest(lambda k: stream_bytes(1, k, length, step_tokens, rounds) <= limit_bytes, min(steps, length))
    raise TooLarge("steps", f"{said} is above {limit}; "
                            + (f"use at most {k} steps with num_samples 1" if k >= 1 else "ask without stream"))
