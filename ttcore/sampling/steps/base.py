"""What a step class is: the settings it accepts, what it holds, and its draw."""

from typing import Protocol

import torch


class ConfiguredStep:
    """What every step class starts from: the run's ``SamplerConfig``."""

    chooses = False

    def __init__(self, config):
        self.config = config


class Step(Protocol):
    """One algorithm for a denoising step's tokens.

    ``adaptive``: it picks positions by the chain rule over the model's full outputs (so it holds every
    position's full head outputs per sequence: admission's memory and compute rule); ``chooses`` (optional,
    default False): it chooses its set from a cheap marginal pass over every masked position, then draws like
    a predetermined step (``fast_adaptive``: a few head outputs per position); ``batchable``: runs with these
    settings may share one joint draw (``step_together``), because the step's set is fixed before the head
    runs."""

    adaptive: bool
    batchable: bool

    def __init__(self, config) -> None: ...

    @classmethod
    def accepts(cls, config) -> bool:
        """Whether this class draws steps with ``config``'s settings."""
        ...

    def draw(self, run, h: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor | None,
             counts: torch.Tensor | None) -> torch.Tensor:
        """This step's tokens for some of ``run``'s sequences (all, unless micro-batched): features h
        [b, l, d], tokens and masked [b, l], the predetermined set ``chosen`` [b, l] (None when adaptive),
        ``counts`` [b] tokens to unmask (None: the step decides). -> [b, l], -1 where nothing was drawn."""
        ...
