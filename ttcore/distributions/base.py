"""The interface every joint p(x | x_t) implements (as torch.distributions.Distribution does for
single variables): exact log-probability, conditional marginals and joint sampling, batched over b."""

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class JointDistribution(Protocol):
    """A joint distribution over b sequences of length l with vocabulary v (``Factorized``, ``CP``,
    ``TensorTrain``). Tokens are ids in [0, v); -1 marks a free (unconditioned / undrawn) position."""

    b: int
    l: int
    v: int

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x) of complete sequences x [b, l] -> [b], exact."""
        ...

    def marginals(self, x_cond: torch.Tensor) -> torch.Tensor:
        """p(x^i | x_S) [b, l, v] for every position given the tokens of x_cond [b, l] (-1 = free);
        one-hot at the conditioned positions."""
        ...

    def sample(self, positions: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """One exact joint draw of the positions [b, l] (all when None), the rest marginalized: -> [b, l],
        -1 off ``positions``."""
        ...

    def chain(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The joint as a chain p(x) = s^T G_1(x^1) ... G_l(x^l) 1, what its product with an automaton needs
        (``automaton.Constrained``): (start s [b, r], cores [b, l, v, r, r], or [b, l, v, r] when ``diagonal``)."""
        ...
