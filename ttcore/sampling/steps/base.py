"""What a step class is: the settings it accepts, and its whole rule for a denoising step: how many tokens
(``counts``), which positions (``plan`` and ``choose``), how they are drawn (``draw``), and what kind of work
that is (``work_kind``, what admission times and prices)."""

from enum import StrEnum
from typing import Protocol

import torch

from ..orderings import PREDETERMINED, top_k_mask
from ..schedules import unmask_counts


class WorkKind(StrEnum):
    """What one step of a run costs, as admission times it. Each member is its own name (so it hashes and
    compares as the string /models reports)."""
    predetermined_step = "predetermined_step"  # a joint draw of a set fixed before the head runs
    chooser_step = "chooser_step"  # a cheap choice over every masked position, then that joint draw
    exact_step = "exact_step"  # a step that sums a format's full head outputs (TT's exact contraction)
    chain_rule = "chain_rule"  # adaptive picks over every position's full head outputs


class Step(Protocol):
    """One algorithm for a denoising step's tokens. A run calls ``plan`` once, then per step ``counts``, and
    when the step needs the model ``choose`` and ``draw`` on features h, for all its sequences or for a
    micro-batch of them (``rows``).

    ``adaptive``: it picks positions by the chain rule over the model's full outputs (so it holds every
    position's full head outputs per sequence: admission's memory and compute rule); ``chooses``: it chooses
    its set from a cheap marginal pass over every masked position, then draws like a predetermined step;
    ``batchable``: its set is fixed by ``choose`` and ``draw`` is the format's joint draw of that set, so runs
    may share one draw (``step_together``)."""

    adaptive: bool
    chooses: bool
    batchable: bool

    def __init__(self, config) -> None: ...

    @classmethod
    def accepts(cls, config) -> bool:
        """Whether this class draws steps with ``config``'s settings."""
        ...

    def plan(self, run) -> torch.Tensor | None:
        """What the run keeps for its whole generation (a predetermined ordering's priorities [b, l], drawn from
        the run's generator), or None."""
        ...

    def counts(self, run, n_current: torch.Tensor) -> torch.Tensor | None:
        """Tokens to unmask in each sequence this step ([b]), or None: the step decides as it draws."""
        ...

    def choose(self, run, h: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, counts: torch.Tensor | None,
               rows: slice) -> torch.Tensor | None:
        """This step's set T [b, l] bool for the run's sequences ``rows`` (features h, tokens and masked of those
        rows), or None when ``draw`` picks as it goes (the chain rule)."""
        ...

    def draw(self, run, h: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor | None,
             counts: torch.Tensor | None) -> torch.Tensor:
        """This step's tokens: [b, l], -1 where nothing was drawn."""
        ...

    def work_kind(self, fmt) -> WorkKind:
        """What a step with these settings costs on a model of format ``fmt``."""
        ...


class ConfiguredStep:
    """What every step class starts from: the run's ``SamplerConfig``, the schedule's counts, a predetermined
    ordering's priorities when the configured ordering is one, and the work kind by the class's flags."""

    adaptive = chooses = batchable = False

    def __init__(self, config):
        self.config = config

    def plan(self, run) -> torch.Tensor | None:
        ordering = PREDETERMINED.get(self.config.ordering)
        return None if ordering is None else ordering(*run.tokens.shape, run.device, run.generator)

    def counts(self, run, n_current: torch.Tensor) -> torch.Tensor:
        """The schedule's tokens per step (``schedules.unmask_counts``; ``bernoulli``: per-position coins)."""
        bernoulli = self.config.bernoulli
        return unmask_counts(run.n_initial, n_current, run.steps, run.step_index, run.schedule, bernoulli,
                             run.generator if bernoulli else None)

    def choose(self, run, h, tokens, masked, counts, rows):
        return None if run.plan is None else top_k_mask(run.plan[rows], masked, counts)

    def work_kind(self, fmt) -> WorkKind:
        c = self.config
        if self.adaptive:
            return WorkKind.chain_rule
        if fmt.sums_exactly(c.contraction, c.temperature, c.joint, False):
            return WorkKind.exact_step
        return WorkKind.chooser_step if self.chooses else WorkKind.predetermined_step


def eb_counts(run, n_current: torch.Tensor) -> torch.Tensor | None:
    """EB-Sampler's count: decided by the bound as the step draws (None), except on the run's last allowed step,
    which takes every masked position."""
    return n_current if run.step_index == run.steps - 1 else None
