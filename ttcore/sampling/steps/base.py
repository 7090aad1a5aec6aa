"""What a step class is: the settings it accepts, and its whole rule for a denoising step: how many tokens
(``counts``), which positions (``plan`` and ``choose``), how they are drawn (``draw``), and what kind of work
that is (``work_kind``, what admission times and prices)."""

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import torch

from ttcore.distributions import Streams

from ..constrained import constrained_step
from ..joint_step import predetermined_step
from ..orderings import PREDETERMINED, top_k_mask
from ..schedules import SCHEDULES, active_steps, unmask_counts
from .settings import StepSettings


class WorkKind(StrEnum):
    """What one step of a run costs, as admission times it. Each member is its own name (so it hashes and
    compares as the string /models reports)."""
    predetermined_step = "predetermined_step"  # a joint draw of a set fixed before the head runs
    chooser_step = "chooser_step"  # a cheap choice over every masked position, then that joint draw
    exact_step = "exact_step"  # a step that sums a format's full head outputs (TT's exact contraction)
    tempered_step = "tempered_step"  # a joint head's step at a temperature other than 1: every masked position summed
    tempered_chooser_step = "tempered_chooser_step"  # that, choosing by the tempered joint's exact marginals first
    chain_rule = "chain_rule"  # adaptive picks over every position's full head outputs
    constrained_step = "constrained_step"  # a step within an automaton's language: full outputs and its messages
    edlm_step = "edlm_step"  # EDLM: k candidates a sequence and one AR forward over them (``steps.edlm``)
    dcd_step = "dcd_step"  # DCD: a diffusion forward per left-context position and an AR pass (a key-value cache's)


@dataclass
class Rows:
    """The sequences a step's ``counts``, ``choose`` and ``draw`` act on: one run's, or those of several runs
    with the same settings stepped together (``batch_step``), or a micro-batch of them. What differs between
    the runs is per sequence: ``n_initial``, ``step`` (steps taken, 0-based), ``steps`` ([b] long each),
    the counter-based ``streams`` (at this step), a predetermined ordering's ``plan`` [b, l] and the
    ``temperature`` (runs of any temperature other than 1 share a group: ``SamplerConfig.batch_key``); a step
    reads the temperature from here, not from ``config``."""
    model: object
    config: object  # the runs' SamplerConfig (equal for all)
    streams: Streams
    n_initial: torch.Tensor
    step: torch.Tensor
    steps: torch.Tensor
    plan: torch.Tensor | None
    length: int  # l, positions per sequence
    temperature: float | torch.Tensor = 1.0  # one for all, or each sequence's [b] (float64): what the draws use
    automaton: object = None  # constrained rows: their ``Automata`` (``ttcore.sampling.constrained``); None: free
    stop: torch.Tensor | None = None  # [b] long: each sequence's stop token (-1: none; ``GenerationRun.stop_token``)

    def __len__(self) -> int:
        return self.n_initial.shape[0]

    def __getitem__(self, index) -> "Rows":
        return Rows(self.model, self.config, self.streams.rows(index), self.n_initial[index], self.step[index],
                    self.steps[index], None if self.plan is None else self.plan[index], self.length,
                    self.temperature[index] if torch.is_tensor(self.temperature) else self.temperature,
                    None if self.automaton is None else self.automaton[index],
                    None if self.stop is None else self.stop[index])

    @property
    def last(self) -> torch.Tensor:
        """[b] bool: this is the sequence's last allowed step."""
        return self.step >= self.steps - 1


class Step(Protocol):
    """One algorithm for a denoising step's tokens. A run calls ``plan`` once; then each step ``counts``, and
    when the step needs the model ``choose`` and ``draw`` on features h, each on ``Rows``: the sequences of
    every run with the same settings at once (``batch_step``), or a micro-batch of them. A sequence's result
    may not depend on the other rows (its uniforms are its own ``streams``), so any grouping gives the same
    tokens.

    ``adaptive``: it picks positions by the chain rule over the model's full outputs (so it holds every
    position's full head outputs per sequence: admission's memory and compute rule); ``chooses``: it chooses
    its set from a cheap marginal pass over every masked position, then draws like a predetermined step.
    ``constrains``: it draws constrained rows (``Rows.automaton``) from the joint restricted to the language.
    ``ar_cache``: its draw holds the paired autoregressive model's key-value cache of its rows (DCD).
    ``Settings``: its own settings' class (``steps.settings``); ``settings``: their values for this run."""

    adaptive: bool
    chooses: bool
    constrains: bool
    ar_cache: bool
    Settings: type[StepSettings]
    settings: StepSettings

    def __init__(self, config) -> None: ...

    @classmethod
    def accepts(cls, config) -> bool:
        """Whether this class draws steps with ``config``'s settings."""
        ...

    def plan(self, run) -> torch.Tensor | None:
        """What the run keeps for its whole generation (a predetermined ordering's priorities [b, l], drawn from
        the run's ``streams``), or None."""
        ...

    def counts(self, rows: Rows, n_current: torch.Tensor) -> torch.Tensor:
        """Tokens to unmask in each sequence this step ([b] long), -1 where the step decides as it draws."""
        ...

    def choose(self, rows: Rows, h: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor,
               counts: torch.Tensor) -> torch.Tensor | None:
        """This step's set T [b, l] bool for ``rows`` (features h, tokens and masked of those rows), or None
        when ``draw`` picks as it goes (the chain rule)."""
        ...

    def draw(self, rows: Rows, h: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor | None,
             counts: torch.Tensor) -> torch.Tensor:
        """This step's tokens: [b, l], -1 where nothing was drawn."""
        ...

    def sums_outputs(self, fmt, temperature) -> bool:
        """Whether, beyond what its format sums (``Decomposition.sums_exactly``), the step holds every masked
        position's full head outputs at once (admission reserves ``cost.summed_outputs_bytes`` for it)."""
        ...

    def work_kind(self, fmt) -> WorkKind:
        """What a step with these settings costs on a model of format ``fmt``."""
        ...

    def work_scale(self, model_cfg) -> float:
        """This step's per-sequence cost over its work kind's timed step (admission multiplies the timing by
        it; 1: as timed). An upper bound where the settings' cost is not exactly proportional."""
        ...

    def active_steps(self, run) -> list[int] | None:
        """The steps of ``run`` that unmask something, when known before they run (None: any may)."""
        ...

    def prefix_needed(self, run) -> int | None:
        """The prefix of positions ``run``'s coming step reads, when the model computes it alone (None: all)."""
        ...


class ConfiguredStep:
    """What every step class starts from: the run's ``SamplerConfig``, the schedule's counts, a predetermined
    ordering's priorities when the configured ordering is one, the joint draw of the chosen set, and the work
    kind by the class's flags."""

    adaptive = chooses = constrains = ar_cache = False
    Settings = StepSettings

    def __init__(self, config):
        self.config = config
        self.settings = self.Settings.of(config)

    @classmethod
    def accepts(cls, config) -> bool:
        return False  # drawn only when a run names it (``sampler``); a default step says which settings it takes

    def sums_outputs(self, fmt, temperature) -> bool:
        return False

    def plan(self, run) -> torch.Tensor | None:
        ordering = PREDETERMINED.get(self.config.ordering)
        return None if ordering is None else ordering(*run.tokens.shape, run.device, run.streams)

    def counts(self, rows: Rows, n_current: torch.Tensor) -> torch.Tensor:
        """The schedule's tokens per step (``schedules.unmask_counts``; ``bernoulli``: per-position coins)."""
        c = self.config
        return unmask_counts(rows.n_initial, n_current, rows.steps, rows.step, SCHEDULES[c.schedule], c.bernoulli,
                             rows.streams, rows.length)

    def choose(self, rows, h, tokens, masked, counts):
        return None if rows.plan is None else top_k_mask(rows.plan, masked, counts)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        """The chosen set drawn jointly by the model's format (``joint_step.predetermined_step``), or for
        constrained rows from the joint restricted to their language (``constrained.constrained_step``)."""
        if rows.automaton is not None:
            return constrained_step(rows.model, h, tokens, masked, chosen, rows.temperature, rows.streams,
                                    rows.automaton)
        return predetermined_step(rows.model, h, tokens, masked, chosen, rows.temperature, rows.streams,
                                  self.config.contraction)

    def prefix_needed(self, run) -> int | None:
        """The positions of ``run``'s coming step that its counts, choice and draw read, when they are a prefix
        that the model computes without the rest (block diffusion: up to the current block), else None: the
        step's forward runs only those."""
        return None

    def active_steps(self, run) -> list[int] | None:
        """The steps of ``run`` (a ``GenerationRun``) that unmask something, known before they run
        (``schedules.active_steps``); None where the counts come from draws (Bernoulli coins) or from the step
        itself (EB's bound)."""
        if self.config.bernoulli or not self.schedule_counts():
            return None
        return active_steps(run.n_initial.tolist(), run.steps, SCHEDULES[self.config.schedule])

    def schedule_counts(self) -> bool:
        """Whether ``counts`` is the schedule's (a subclass that overrides ``counts`` says when it is)."""
        return type(self).counts is ConfiguredStep.counts

    def work_kind(self, fmt) -> WorkKind:
        c = self.config
        if self.adaptive:
            return WorkKind.chain_rule
        if fmt.joint_head and c.temperature != 1:  # the tempered joint's normaliser reads every masked position
            return WorkKind.tempered_chooser_step if self.chooses else WorkKind.tempered_step
        if fmt.sums_exactly(c.contraction, c.temperature, c.joint, False):
            return WorkKind.exact_step
        return WorkKind.chooser_step if self.chooses else WorkKind.predetermined_step

    def work_scale(self, model_cfg) -> float:
        return 1.0


def eb_counts(rows: Rows, n_current: torch.Tensor) -> torch.Tensor:
    """EB-Sampler's count: decided by the bound as the step draws (-1), except on a sequence's last allowed
    step, which takes every masked position."""
    return torch.where(rows.last, n_current, torch.full_like(n_current, -1))
