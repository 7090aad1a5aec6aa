"""Admission by cost: each request's memory and compute are estimated before it is admitted.

Memory: ``ttcore.sampling.cost`` gives the bytes one step holds per sequence (from the model's shape);
a request larger than the memory budget is drawn in micro-batches of sequences (``max_rows_per_pass``),
so its peak stays under the budget whatever ``num_samples`` is.

Compute: each kind of work of a checkpoint is timed on this machine when a request first needs it
(``Speed.ensure``, best of a few short timings at one row and at ``CALIBRATION_ROWS`` rows): a predetermined
step, for TT an exact-contraction step, a fast adaptive step (a cheap choice, then a joint draw), each as a
per-step overhead plus a cost per sequence, and the chain-rule picks of a whole adaptive generation per
sequence (from one pick). The engine
then corrects each per-sequence cost from the time every request took (``Speed.observe``). A request's
estimate is steps x (overhead + sequences x step cost) + sequences x chain-rule time; it must fit the
request's deadline, and its longest step must fit the step limit (half the stall limit that ``/health``
watches). A request that cannot fit gets a 422 naming a setting that would (the largest ``num_samples``,
two significant digits, or ``steps``), checked by this same rule. Before refusing a request of a kind that
no request has measured yet, the service re-times that kind on its model's idle worker
(``Speed.recalibrate``) and decides by the fresh timing."""

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass

from ttcore.distributions.streams import warm_streams
from ttcore.sampling import GenerationRun, SamplerConfig, cost
from ttcore.sampling.steps import WorkKind

from .refusals import TooLarge

WINDOW = 8  # observations per kind of work that the estimate is the median of
CALIBRATION_REPEATS = 3  # best of this many short timings at start-up
CALIBRATION_ROWS = 16  # the batched calibration step: a step of n rows costs overhead + n x per-row
RECALIBRATE_EVERY_S = 60.0  # a kind is re-timed before a refusal at most this often (each costs < 1 s of work)


class Speed:
    """Seconds on this machine of four kinds of work (``SamplerConfig.work_kind``): one predetermined step
    (forward + joint draw), one exact-contraction step (TT), one fast adaptive step (forward + choice + joint
    draw), and a whole generation's chain-rule picks (adaptive orderings and EB by the exact chain rule, any
    step count), per sequence.

    A step of n sequences is estimated as ``overhead + n x per_row`` (``step_seconds``): a step of 256 rows
    is not 256 one-row steps (measured on qm9-cp-r64: 4.8 ms for one row, 249 ms for 256, 0.97 ms a row).
    Both start from a timing of the kind on this machine (``calibrate_kinds``: one row and
    ``CALIBRATION_ROWS`` rows), taken when a request first needs the kind (``ensure``, on the model's worker:
    ``Speed.lazy()``), not at start-up, so a server starts in seconds whatever it serves and however busy the
    machine is then (timing every kind of the bundled checkpoints at start took 15 s quiet, 42 s beside two
    CPU burners). The overhead stays the timing's; the per-row cost is the median of the last ``WINDOW``
    observations of its kind and starts with the timing's. Every request the engine runs adds one observation
    when it finishes or its deadline passes (``observe``), so a timing taken while the machine was busy is
    outvoted after two ordinary requests, and a machine that turns busy raises the estimate as fast. A kind
    that no request has measured yet, whose requests are all refused, would never be corrected: the service
    re-times it (``recalibrate``) on its model's idle worker before it refuses such a request, at most once
    every ``RECALIBRATE_EVERY_S`` per kind."""

    KINDS = tuple(WorkKind)

    def __init__(self, predetermined_step: float | None, exact_step: float | None, chain_rule: float | None,
                 chooser_step: float | None = None, overhead: dict[WorkKind, float] | None = None):
        first = dict(predetermined_step=predetermined_step, exact_step=exact_step, chain_rule=chain_rule,
                     chooser_step=predetermined_step if chooser_step is None else chooser_step)
        self._seen = {k: deque([] if first[k] is None else [first[k]], maxlen=WINDOW) for k in self.KINDS}
        self.overhead = {k: 0.0 for k in self.KINDS} | dict(overhead or {})
        self.overhead[WorkKind.chain_rule] = 0.0
        self.measured: set[WorkKind] = set()
        self._recalibrated: dict[WorkKind, float] = {}  # kind -> when it was last re-timed (time.monotonic)

    @classmethod
    def lazy(cls) -> "Speed":
        """No kind timed yet: each is timed when a request first needs it (``ensure``)."""
        return cls(None, None, None)

    def timed(self, kind: WorkKind) -> bool:
        """Whether the kind has an estimate (a timing or a measured request)."""
        return bool(self._seen[kind])

    def needs(self, kind: WorkKind) -> list[WorkKind]:
        """The kinds an estimate of ``kind`` reads (a chain-rule run's steps are predetermined steps) that have
        none yet."""
        wanted = {self._step_kind(kind)} | ({WorkKind.chain_rule} if kind == WorkKind.chain_rule else set())
        return sorted(k for k in wanted if not self.timed(k))

    def ensure(self, model, kind: WorkKind) -> None:
        """Time what an estimate of ``kind`` needs and does not have yet (``calibrate_kinds``; on the model's
        worker, or wherever the model may run)."""
        missing = self.needs(kind)
        if missing:
            for k, (overhead, per_row) in calibrate_kinds(model, missing).items():
                if not self.timed(k):
                    self.overhead[k] = overhead if k != WorkKind.chain_rule else 0.0
                    self._seen[k].append(per_row)
                    self._recalibrated[k] = time.monotonic()  # just timed: no re-timing before a refusal

    def estimate(self, kind: WorkKind) -> float:
        """The current per-sequence estimate of a kind of work: the median of its recent observations."""
        return statistics.median(self._seen[kind])

    predetermined_step = property(lambda self: self.estimate(WorkKind.predetermined_step))
    exact_step = property(lambda self: self.estimate(WorkKind.exact_step))
    chooser_step = property(lambda self: self.estimate(WorkKind.chooser_step))
    chain_rule = property(lambda self: self.estimate(WorkKind.chain_rule))

    def _step_kind(self, kind: WorkKind) -> WorkKind:
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        return WorkKind.predetermined_step if kind == WorkKind.chain_rule else kind  # a chain-rule run's steps

    def step_seconds(self, kind: WorkKind, rows: int = 1) -> float:
        """One step of a run of this kind over ``rows`` sequences: overhead + rows x per-row (a chain-rule
        run's steps are predetermined steps; its picks are ``chain_rule``, per sequence)."""
        kind = self._step_kind(kind)
        return self.overhead[kind] + rows * self.estimate(kind)

    def unmeasured(self, kind: WorkKind) -> bool:
        """Whether no request of this kind has been measured yet (only the start-up calibration speaks)."""
        return kind not in self.measured

    def observe(self, *, kind: WorkKind, rows: int, steps: int, seconds: float,
                overhead_steps: float | None = None) -> None:
        """A request of this kind of work that ran ``steps`` engine steps over ``rows`` sequences and was
        charged ``seconds`` of compute (its shares of the batched steps it was part of). ``overhead_steps``:
        the steps' overhead it was charged, in steps (its share of each step's sequences, summed; default:
        ``steps``, as when it ran alone)."""
        if rows <= 0 or steps <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        step_kind = self._step_kind(kind)
        overhead = self.overhead[step_kind] * (steps if overhead_steps is None else overhead_steps)
        per_row = max(seconds - overhead, 0.0) / rows
        if kind == WorkKind.chain_rule:  # the steps' own cost as now estimated; the rest is the chain rule's
            self._seen[WorkKind.chain_rule].append(max(per_row - steps * self.estimate(step_kind), 0.0))
        else:
            self._seen[kind].append(per_row / steps)
        self.measured.add(kind)


    def may_recalibrate(self, kind: WorkKind) -> bool:
        """Whether a refusal of this kind should first re-time it: no request has measured it, and it was not
        re-timed in the last ``RECALIBRATE_EVERY_S``."""
        last = self._recalibrated.get(kind)
        return self.unmeasured(kind) and (last is None or time.monotonic() - last > RECALIBRATE_EVERY_S)

    def recalibrate(self, model, kind: WorkKind) -> None:
        """Re-time one kind as ``calibrate`` does and start its estimate afresh from that timing (runs on the
        model's worker; a few tenths of a second at most for the bundled models)."""
        self._recalibrated[kind] = time.monotonic()
        for k, (overhead, per_row) in calibrate_kinds(model, [kind]).items():
            if k == kind or self.unmeasured(k):  # what requests measured stays (a chain rule re-times its steps)
                self.overhead[k] = overhead if k != WorkKind.chain_rule else 0.0
                self._seen[k] = deque([per_row], maxlen=WINDOW)


def _best(model, n: int, steps: int, repeats: int = CALIBRATION_REPEATS, **settings) -> float:
    """The shortest of ``repeats`` timings of one step of a fresh run of ``n`` sequences (the shortest: a busy
    machine only ever slows a timing down)."""
    times = []
    for _ in range(repeats):
        run = GenerationRun(model, n, steps, SamplerConfig(**settings), seed=0)
        t0 = time.perf_counter()
        with model.compute_context():
            run.step()
        times.append(time.perf_counter() - t0)
    return min(times)


def _affine(model, steps: int, repeats: int, **settings) -> tuple[float, float]:
    """(overhead, per row) of one step, from a one-row and a ``CALIBRATION_ROWS``-row timing."""
    one = _best(model, 1, steps, repeats, **settings)
    many = _best(model, CALIBRATION_ROWS, steps, repeats, **settings)
    per_row = max(many - one, 0.0) / (CALIBRATION_ROWS - 1) or many / CALIBRATION_ROWS
    return max(one - per_row, 0.0), per_row


def calibrate_kinds(model, kinds) -> dict[WorkKind, tuple[float, float]]:
    """(overhead, per row) of each kind in ``kinds`` (chain_rule: (0, its per-sequence estimate)), timed after
    a warm-up step; a chain-rule estimate needs the predetermined step's timing and takes it too."""
    warm_streams(next(model.parameters()).device)  # compiled streams (on CUDA) compile here, not in a timing
    _best(model, 1, 4, 1)  # warm-up: allocator, kernels
    out = {}
    if WorkKind.predetermined_step in kinds or WorkKind.chain_rule in kinds:
        out[WorkKind.predetermined_step] = _affine(model, 4, CALIBRATION_REPEATS)
    if WorkKind.exact_step in kinds:
        has_exact = "exact" in model.format.contractions
        out[WorkKind.exact_step] = _affine(model, 4, 2, contraction="exact") if has_exact else \
            out.get(WorkKind.predetermined_step) or _affine(model, 4, CALIBRATION_REPEATS)
    if WorkKind.chooser_step in kinds:
        out[WorkKind.chooser_step] = _affine(model, 4, CALIBRATION_REPEATS, ordering="top_prob", adaptive_path="fast")
    if WorkKind.chain_rule in kinds:
        l = model.cfg.dit.length
        step = sum(out[WorkKind.predetermined_step])  # one row: overhead + per row
        first_pick = max(_best(model, 1, l, 2, ordering="top_prob", adaptive_path="exact") - step, 0.0)
        out[WorkKind.chain_rule] = (0.0, l * first_pick / 2)
    return out


def calibrate(model) -> Speed:
    """Every kind timed now (the service times each when first needed: ``Speed.lazy``, ``Speed.ensure``): short
    timings of each kind of step, after a warm-up (the predetermined and
    fast adaptive steps best of three, the exact step best of two), each at one row and at
    ``CALIBRATION_ROWS`` rows (``Speed``'s overhead and per-row cost), and the first chain-rule pick on one
    sequence: about a second for the bundled text model, tenths of a second for QM9. The chain rule is not
    run to the end (a text model's picks take many seconds): one pick is timed and the whole is taken as l
    picks at half that cost each (the picks shrink as positions are conditioned; measured at text size the
    whole was 0.29 of l first picks, at QM9 size 0.6). This is approximate by construction: measured
    requests replace it (``Speed.observe``)."""
    timed = calibrate_kinds(model, Speed.KINDS)
    return Speed(timed[WorkKind.predetermined_step][1], timed[WorkKind.exact_step][1], timed[WorkKind.chain_rule][1],
                 timed[WorkKind.chooser_step][1], {k: v[0] for k, v in timed.items()})


def _round_down(n: int) -> int:
    """A hint that stays put while the estimate moves by a percent: two significant digits, rounded down
    (152 and 151 both say 150)."""
    if n < 100:
        return n
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
    kind = config.work_kind(cfg)
    chooses = config.step.chooses  # the fast path's choice (at temperature != 1 too)
    rows = cost.rows_per_pass(cfg, adaptive, memory_budget, exact, chooses, config.chooser_outputs)
    if rows == 0:
        need = cost.step_row_bytes(cfg, adaptive, chooses, config.chooser_outputs) >> 20
        raise TooLarge("ordering", f"one sequence of this model needs about {need} MB per step with this "
                                   f"ordering, above the server's memory budget of {memory_budget >> 20} MB; "
                                   "use a predetermined ordering (random, left_to_right, halton)")
    l = cfg.dit.length
    chain = speed.chain_rule if adaptive else 0.0

    def estimate(n: int, k: int) -> tuple[float, float]:
        """(the whole run, its longest step) of n sequences at ``k`` steps; idle steps cost nothing; a step
        of more than ``rows`` sequences runs in passes, each with the step's overhead."""
        k = min(k, l)
        step = speed.step_seconds(kind, n) + speed.overhead[speed._step_kind(kind)] * (math.ceil(n / rows) - 1)
        return k * step + n * chain, step + n * chain * math.ceil(l / k) / l  # a step makes <= ceil(l/k) picks

    def fits(n: int, k: int) -> bool:
        whole, step = estimate(n, k)
        return whole <= timeout_s and step <= step_limit_s

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
                                    f"timeout_s {timeout_s:g} and the {step_limit_s:g} s step limit; use at most {k} "
                                    f"steps{with_n}", compute=True)
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
