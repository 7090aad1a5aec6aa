"""Admission by cost: each request's memory and compute are estimated before it is admitted.

The cost model is ``ttcore.sampling.cost``'s; this module holds the rule. Memory: the bytes one step holds per
sequence (``cost.run_row_bytes``, from the model's shape and the request's settings);
a request larger than the memory budget is drawn in micro-batches of sequences (``max_rows_per_pass``),
so its peak stays under the budget whatever ``num_samples`` is.

Compute: ``service.speed.Speed``, the rate of each kind of work (``cost.work_of``) timed on first use and scaled
by the slowest recent ratio of measured to modelled time (an upper bound of recent requests that never falls to zero). A
request's estimate is steps x (overhead + sequences x step cost) + sequences x chain-rule time; with
``WALL_HEADROOM`` for what a request spends outside compute it must fit the request's deadline, and its longest
step must fit the step limit (half the stall limit that ``/health`` watches). A request that cannot fit gets a
422 naming a setting that would (the largest ``num_samples`` or ``steps`` that fits with ``HINT_MARGIN`` to spare,
rounded down to a coarse grid, so the hint holds while the machine's speed and the estimate move), checked by this
same rule."""

import math
from dataclasses import dataclass

from ttcore.sampling import SamplerConfig, cost

from .refusals import TooLarge
from .speed import WALL_HEADROOM, Speed

HINT_MARGIN = 1.5  # a refusal's hint is a setting whose estimate fits its deadline with this much to spare: the
# machine's speed moves between the refusal and the follow-up (a shared machine: 10-50%), and a hint that is
# admitted only to miss its deadline (504) misleads; a follow-up inside the margin is still admitted


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
         memory_budget: int, step_limit_s: float, constraint=None, constraint_field: str = "regex") -> Plan:
    """Micro-batching and compute estimate of a request sampled with ``config`` (and within ``constraint``, a
    ``TokenDFA``, named by the request's ``constraint_field``), or TooLarge naming what to lower."""
    cfg = model.cfg
    adaptive, _ = config.step_kind(cfg)
    rows = cost.run_rows(model, config, memory_budget, constraint)
    if rows == 0:
        need = cost.run_row_bytes(model, config, constraint) >> 20
        if constraint is not None:
            raise TooLarge(constraint_field, f"one sequence needs about {need} MB per step within this "
                                             f"constraint, above the server's memory budget of "
                                             f"{memory_budget >> 20} MB")
        raise TooLarge("ordering", f"one sequence of this model needs about {need} MB per step with this "
                                   f"ordering, above the server's memory budget of {memory_budget >> 20} MB; "
                                   "use a predetermined ordering (random, left_to_right, halton)")
    l = cfg.dit.length

    def estimate(n: int, k: int) -> tuple[float, float]:
        """(the whole run, its longest step) of n sequences at ``k`` steps, margin included; idle steps cost
        nothing; a step of more than ``rows`` sequences runs in passes, each with the step's overhead."""
        k = min(k, l)
        work = cost.work_of(cfg, config, k, constraint)
        step = speed.step_seconds(work.kind, n, work.scale) + speed.overhead_seconds(work.kind, n) * (
            math.ceil(n / rows) - 1)
        chain = speed.chain_seconds(n) if adaptive else 0.0
        return k * step + chain, step + chain * math.ceil(l / k) / l  # a step makes <= ceil(l/k) picks

    def within(whole: float, step: float, margin: float = 1.0) -> bool:  # the margin: the deadline's
        return whole * WALL_HEADROOM * margin <= timeout_s and step <= step_limit_s

    def fits(n: int, k: int, margin: float = 1.0) -> bool:
        return within(*estimate(n, k), margin)

    def hinted(n: int, k: int) -> bool:  # what a refusal names: admitted with HINT_MARGIN to spare (where any is)
        return fits(n, k, HINT_MARGIN)

    seconds, step_seconds = estimate(num_samples, steps)
    micro = rows if rows < num_samples else None
    if within(seconds, step_seconds):
        return Plan(micro, seconds, step_seconds)
    fit = _largest(lambda n: hinted(n, steps), num_samples) or _largest(lambda n: fits(n, steps), num_samples)
    if fit >= 1:
        raise TooLarge("num_samples", f"this setting needs about {seconds:.3g} s of compute here (one step "
                                      f"about {step_seconds:.3g} s); within timeout_s {timeout_s:g} and "
                                      f"the {step_limit_s:g} s step limit, num_samples can be at most "
                                      f"{_round_down(fit)}", compute=True)
    for n in (num_samples, 1):  # a step count that fits, the largest below the one asked
        k = next((k for k in range(min(steps, l), 0, -1) if hinted(n, k)), None) or \
            next((k for k in range(min(steps, l), 0, -1) if fits(n, k)), None)  # to spare, else at all
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
