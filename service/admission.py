"""Admission by cost: each request's memory and compute are estimated before it is admitted.

Memory: ``ttcore.sampling.cost`` gives the bytes one step holds per sequence (from the model's shape);
a request larger than the memory budget is drawn in micro-batches of sequences (``max_rows_per_pass``),
so its peak stays under the budget whatever ``num_samples`` is.

Compute: at start-up every checkpoint is timed on this machine (``calibrate``): a predetermined step
per sequence, a whole adaptive (chain-rule) generation per sequence, and for TT an exact-contraction
step per sequence. A request's estimate is sequences x (steps x step time + chain-rule time); it must
fit the request's deadline, and its longest step must fit the stall limit that ``/health`` watches.
A request that cannot fit gets a 422 naming the largest ``num_samples`` (or ``steps``) that would.
"""

import math
import time
from dataclasses import dataclass

from ttcore.sampling import ADAPTIVE, GenerationRun, cost


class TooLarge(ValueError):
    """The request can never fit this server's limits; ``field`` names what to lower."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass
class Speed:
    """Seconds on this machine, per sequence: one predetermined step (forward + joint draw), one
    exact-contraction step (TT), a whole chain-rule generation (all l picks, any step count)."""
    predetermined_step: float
    exact_step: float
    chain_rule: float


def _timed(model, n: int, steps: int, **settings) -> float:
    run = GenerationRun(model, n, steps, seed=0, **settings)
    t0 = time.perf_counter()
    with model.compute_context():
        run.step()
    first = time.perf_counter() - t0
    if settings.get("ordering") in ADAPTIVE:  # the rest of the picks too
        t0 = time.perf_counter()
        with model.compute_context():
            while not run.done:
                run.step()
        first += time.perf_counter() - t0
    return first / n


def calibrate(model) -> Speed:
    """Time the three kinds of work on 2 sequences (after a warm-up)."""
    _timed(model, 1, 4)  # warm-up: allocator, kernels
    pred = _timed(model, 2, 4)
    exact = _timed(model, 2, 4, contraction="exact") if model.cfg.decomposition == "tt" else pred
    chain = _timed(model, 2, 4, ordering="top_prob")
    return Speed(pred, exact, chain)


@dataclass
class Plan:
    """What admission decided: the micro-batch size and the estimated compute."""
    max_rows_per_pass: int | None
    seconds: float  # estimated compute of the whole request
    step_seconds: float  # estimated compute of its longest step


def plan(model, speed: Speed, *, num_samples: int, steps: int, adaptive: bool, exact: bool, timeout_s: float,
         memory_budget: int, step_limit_s: float) -> Plan:
    """Micro-batching and compute estimate of a request, or TooLarge naming what to lower."""
    cfg = model.cfg
    rows = cost.rows_per_pass(cfg, adaptive, memory_budget, exact)
    if rows == 0:
        need = cost.step_row_bytes(cfg, adaptive) >> 20
        raise TooLarge("ordering", f"one sequence of this model needs about {need} MB per step with this "
                                   f"ordering, above the server's memory budget of {memory_budget >> 20} MB; "
                                   "use a predetermined ordering (random, left_to_right, halton)")
    l = cfg.dit.length
    per_step = speed.exact_step if exact and not adaptive else speed.predetermined_step
    per_row = min(steps, l) * per_step + (speed.chain_rule if adaptive else 0.0)  # idle steps cost nothing
    picks_per_step = math.ceil(l / min(steps, l)) / l  # the largest share of the picks one step makes
    per_row_step = per_step + (speed.chain_rule * picks_per_step if adaptive else 0.0)
    seconds, step_seconds = num_samples * per_row, num_samples * per_row_step
    if seconds > timeout_s or step_seconds > step_limit_s:
        fit = int(min(timeout_s / per_row, step_limit_s / per_row_step))
        if fit >= 1:
            raise TooLarge("num_samples", f"this setting needs about {seconds:.0f} s of compute here (one step "
                                          f"about {step_seconds:.0f} s); within timeout_s {timeout_s:g} and "
                                          f"the {step_limit_s:g} s step limit, num_samples can be at most {fit}")
        max_steps = int(timeout_s / max(per_step, 1e-9))
        raise TooLarge("steps", f"one sequence needs about {per_row:.0f} s here, more than timeout_s {timeout_s:g}; "
                                f"use fewer steps (at most about {max_steps}) or a predetermined ordering")
    return Plan(rows if rows < num_samples else None, seconds, step_seconds)

