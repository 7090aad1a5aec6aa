"""Admission by cost: each request's memory and compute are estimated before it is admitted.

Memory: ``ttcore.sampling.cost`` gives the bytes one step holds per sequence (from the model's shape);
a request larger than the memory budget is drawn in micro-batches of sequences (``max_rows_per_pass``),
so its peak stays under the budget whatever ``num_samples`` is.

Compute: at start-up every checkpoint is timed on this machine (``calibrate``, best of three short
timings): a predetermined step per sequence, for TT an exact-contraction step per sequence, a fast adaptive
step (a cheap choice, then a joint draw) per sequence, and the chain-rule picks of a whole adaptive
generation per sequence (from one pick). The engine then corrects
each estimate from the time every finished request took (``Speed.observe``). A request's estimate is
sequences x (steps x step time + chain-rule time); it must fit the request's deadline, and its longest
step must fit the stall limit that ``/health`` watches. A request that cannot fit gets a 422 naming a
setting that would (the largest ``num_samples``, or ``steps``), checked by this same rule.
"""

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass

from ttcore.decompositions import get_decomposition
from ttcore.sampling import GenerationRun, SamplerConfig, cost


class TooLarge(ValueError):
    """The request can never fit this server's limits; ``field`` names what to lower."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


WINDOW = 8  # observations per kind of work that the estimate is the median of
CALIBRATION_REPEATS = 3  # best of this many short timings at start-up


class Speed:
    """Seconds on this machine, per sequence, of four kinds of work (``SamplerConfig.work_kind``): one
    predetermined step (forward + joint draw), one exact-contraction step (TT), one fast adaptive step
    (forward + choice + joint draw), and a whole generation's chain-rule picks (adaptive orderings and EB
    by the exact chain rule, any step count).

    Each estimate is the median of the last ``WINDOW`` observations of its kind, and starts with one: the
    start-up calibration (``calibrate``). Every request the engine finishes adds one observation, its
    measured time per sequence (``observe``), so a calibration taken while the machine was busy is
    outvoted after two ordinary requests, and a machine that turns busy raises the estimate as fast."""

    KINDS = ("predetermined_step", "exact_step", "chooser_step", "chain_rule")

    def __init__(self, predetermined_step: float, exact_step: float, chain_rule: float,
                 chooser_step: float | None = None):
        first = dict(predetermined_step=predetermined_step, exact_step=exact_step, chain_rule=chain_rule,
                     chooser_step=predetermined_step if chooser_step is None else chooser_step)
        self._seen = {k: deque([first[k]], maxlen=WINDOW) for k in self.KINDS}

    def estimate(self, kind: str) -> float:
        """The current estimate of a kind of work: the median of its recent observations."""
        return statistics.median(self._seen[kind])

    predetermined_step = property(lambda self: self.estimate("predetermined_step"))
    exact_step = property(lambda self: self.estimate("exact_step"))
    chooser_step = property(lambda self: self.estimate("chooser_step"))
    chain_rule = property(lambda self: self.estimate("chain_rule"))

    def step_seconds(self, kind: str) -> float:
        """One step of a run of this kind, per sequence (a chain-rule run's steps: the predetermined step's,
        its picks are ``chain_rule``)."""
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        return self.estimate("predetermined_step" if kind == "chain_rule" else kind)

    def observe(self, *, kind: str, rows: int, steps: int, seconds: float) -> None:
        """A finished request of this kind of work: ``rows`` sequences, ``steps`` engine steps, ``seconds``
        of compute charged to it (its shares of the batched steps it was part of)."""
        if rows <= 0 or steps <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        per_row = seconds / rows
        if kind == "chain_rule":  # the steps' own cost as now estimated; the rest is the chain rule's
            self._seen["chain_rule"].append(max(per_row - steps * self.step_seconds(kind), 0.0))
        else:
            self.step_seconds(kind)  # raises for an unknown kind
            self._seen[kind].append(per_row / steps)


def _best(model, n: int, steps: int, repeats: int = CALIBRATION_REPEATS, **settings) -> float:
    """The shortest of ``repeats`` timings of one step of a fresh run, per sequence (the shortest: a busy
    machine only ever slows a timing down)."""
    times = []
    for _ in range(repeats):
        run = GenerationRun(model, n, steps, SamplerConfig(**settings), seed=0)
        t0 = time.perf_counter()
        with model.compute_context():
            run.step()
        times.append((time.perf_counter() - t0) / n)
    return min(times)


def calibrate(model) -> Speed:
    """Start-up estimates from one step of each kind (after a warm-up; the cheap predetermined step best of
    three, the exact step and the first chain-rule pick, on one sequence, best of two): about a second for
    the bundled text model, milliseconds for QM9. The chain rule is not run to the end (a text model's
    picks take many seconds): one pick is timed and the whole is taken as l picks at half that cost each
    (the picks shrink as positions are conditioned; measured at text size the whole was 0.29 of l first
    picks, at QM9 size 0.6). This is approximate by construction: finished requests replace it (``Speed.observe``)."""
    _best(model, 1, 4)  # warm-up: allocator, kernels
    pred = _best(model, 2, 4)
    has_exact = "exact" in get_decomposition(model.cfg.decomposition).contractions
    exact = _best(model, 1, 4, 2, contraction="exact") if has_exact else pred
    chooser = _best(model, 2, 4, ordering="top_prob", adaptive_path="fast")
    l = model.cfg.dit.length
    first_pick = max(_best(model, 1, l, 2, ordering="top_prob") - pred, 0.0)
    return Speed(pred, exact, l * first_pick / 2, chooser)


@dataclass
class Plan:
    """What admission decided: the micro-batch size and the estimated compute."""
    max_rows_per_pass: int | None
    seconds: float  # estimated compute of the whole request
    step_seconds: float  # estimated compute of its longest step


def plan(model, speed: Speed, *, num_samples: int, steps: int, config: SamplerConfig, timeout_s: float,
         memory_budget: int, step_limit_s: float) -> Plan:
    """Micro-batching and compute estimate of a request sampled with ``config``, or TooLarge naming what to
    lower."""
    cfg = model.cfg
    adaptive, exact = config.step_kind(cfg)
    kind = config.work_kind(cfg)
    chooses = kind == "chooser_step"
    rows = cost.rows_per_pass(cfg, adaptive, memory_budget, exact, chooses)
    if rows == 0:
        need = cost.step_row_bytes(cfg, adaptive, chooses) >> 20
        raise TooLarge("ordering", f"one sequence of this model needs about {need} MB per step with this "
                                   f"ordering, above the server's memory budget of {memory_budget >> 20} MB; "
                                   "use a predetermined ordering (random, left_to_right, halton)")
    l = cfg.dit.length
    per_step = speed.step_seconds(kind)

    def per_row(k: int) -> tuple[float, float]:
        """(the whole run, its longest step) per sequence at ``k`` steps; idle steps cost nothing."""
        k = min(k, l)
        chain = speed.chain_rule if adaptive else 0.0
        return k * per_step + chain, per_step + chain * math.ceil(l / k) / l  # a step makes <= ceil(l/k) picks

    def fits(n: int, k: int) -> bool:
        whole, step = per_row(k)
        return n * whole <= timeout_s and n * step <= step_limit_s

    whole, step = per_row(steps)
    seconds, step_seconds = num_samples * whole, num_samples * step
    if not fits(num_samples, steps):
        fit = int(min(timeout_s / whole, step_limit_s / step))
        if fit >= 1:
            raise TooLarge("num_samples", f"this setting needs about {seconds:.3g} s of compute here (one step "
                                          f"about {step_seconds:.3g} s); within timeout_s {timeout_s:g} and "
                                          f"the {step_limit_s:g} s step limit, num_samples can be at most {fit}")
        for n in (num_samples, 1):  # a step count that fits, the largest below the one asked
            k = next((k for k in range(min(steps, l), 0, -1) if fits(n, k)), None)
            if k is not None:
                with_n = "" if n == num_samples else " with num_samples 1"
                raise TooLarge("steps", f"one sequence needs about {whole:.3g} s here, more than fits timeout_s "
                                        f"{timeout_s:g} and the {step_limit_s:g} s step limit; use at most {k} "
                                        f"steps{with_n}")
        raise TooLarge("timeout_s", f"no num_samples or steps fits timeout_s {timeout_s:g} here: one sequence at "
                                    f"one step needs about {per_row(1)[0]:.3g} s"
                                    + ("; use a predetermined ordering (random, left_to_right, halton)"
                                       if adaptive else ""))
    return Plan(rows if rows < num_samples else None, seconds, step_seconds)


def check_passes(sequences: int, draws: int, per_pass: float, timeout_s: float, step_limit_s: float,
                 mode: str) -> float:
    """Scoring's admission: ``sequences`` x ``draws`` model passes at ``per_pass`` seconds each must fit
    the deadline; one pass of every sequence (the largest piece) the step limit. -> estimated seconds, or
    TooLarge naming the largest ``num_mc`` or number of ``sequences`` that fits."""
    seconds = sequences * draws * per_pass
    if seconds <= timeout_s and sequences * per_pass <= step_limit_s:
        return seconds
    fit_draws = int(timeout_s / (sequences * per_pass)) if sequences * per_pass <= step_limit_s else 0
    if mode == "elbo" and fit_draws >= 1:
        raise TooLarge("num_mc", f"{sequences} sequences x {draws} draws need about {seconds:.3g} s of compute here, "
                                 f"more than timeout_s {timeout_s:g}; num_mc can be at most {fit_draws}")
    fit = int(min(timeout_s / (draws * per_pass), step_limit_s / per_pass))
    raise TooLarge("sequences", f"{sequences} sequences x {draws} passes need about {seconds:.3g} s of compute "
                                f"here, more than timeout_s {timeout_s:g}; at most {max(fit, 0)} sequences fit"
                                + ("" if fit >= 1 else ": use a longer timeout_s"))
