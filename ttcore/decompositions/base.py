"""The interfaces a format plugs into: what its head outputs are (``HeadOutputs``), what a format is
(``Decomposition``: it builds its head module and answers the joint questions from that head's outputs),
and what the samplers need of a model (``Denoiser``)."""

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ttcore.distributions import JointDistribution

from .heads import OutputHead


@runtime_checkable
class HeadOutputs(Protocol):
    """A model's head evaluated on the masked positions M of x_t (row-major over ``mask`` [b, l]): it
    builds p(x | x_t) and scores masked targets under it. float32 unless the model runs in float64."""

    mask: torch.Tensor  # [b, l] bool

    def joint(self, tokens: torch.Tensor, temperature: float = 1.0) -> JointDistribution:
        """p(x | x_t) over whole sequences at ``temperature``; the known positions of ``tokens`` [b, l]
        are exact (one-hot / delta * I)."""
        ...

    def log_prob(self, x0: torch.Tensor) -> torch.Tensor:
        """log p(x0_M | x_t), the joint over the masked set (the training objective's term). -> [b]."""
        ...

    def marginal_log_probs(self, x0: torch.Tensor) -> torch.Tensor:
        """log p(x0^i | x_t) under the joint's exact single-position marginal, for each masked i. -> [m]."""
        ...

    def auxiliary_loss(self) -> torch.Tensor:
        """Any extra training term of this decomposition (TT: L_C of Eq. 19), else 0. -> []."""
        ...


class Decomposition(Protocol):
    """A format of p(x | x_t): everything that differs between rank 1, CP and TT. It builds its head module
    (``build_head``) and answers every joint question from the outputs of that head, which it computes on
    the positions that need them; it never calls the model. ``register_decomposition`` adds one."""

    name: str
    joint_head: bool  # False for rank 1: the base head W, no joint head (the model's head is "base")
    contractions: tuple[str, ...]  # how masked positions outside a step's set may be summed out (TT: 2)
    joint_dtype: torch.dtype  # what a whole-sequence joint (``HeadOutputs.joint``) holds per head-output value
    chains: bool  # its joint answers ``chain()`` (``JointDistribution.chain``): what a constrained step draws from

    def outputs_per_position(self, rank: int) -> int:
        """E, the head outputs per masked position (each a distribution over v)."""
        ...

    def build_head(self, rank: int, kind: str, hidden_dim: int, out_vocab: int, base: nn.Linear | None) -> OutputHead:
        """This format's head module at ``rank``: ``kind`` 1layer / 2layer (joint heads), reading the base W
        (``base``: None when a 1-layer joint head replaces it). Extra heads are zero-initialized."""
        ...

    def outputs(self, head: OutputHead, h: torch.Tensor, mask: torch.Tensor) -> HeadOutputs:
        """The head on the masked positions of h [b, l, d] (training and scoring)."""
        ...

    def draw(self, head: OutputHead, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
             temperature: float, generator, contraction: str) -> torch.Tensor:
        """One exact joint draw of x_T, T = ``chosen`` [b, l] (Sec. 4.3), computing only the head outputs
        the draw needs. -> [b, l], -1 off T."""
        ...

    def marginals_at(self, head: OutputHead, h: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
                     temperature: float, contraction: str) -> torch.Tensor:
        """p(x^i | x_t) at the ``chosen`` [b, l] positions only, float64: the exact single-position marginals
        (Eqs. 14-17, S = the known positions) of the joint ``draw`` draws x_T from with the same
        ``contraction`` (the rank-1 view of a predetermined step). -> [m, v]."""
        ...

    def chosen_log_prob(self, head: OutputHead, h: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
                        x: torch.Tensor) -> torch.Tensor:
        """log p(x_T | x_t) of the tokens x [b, l] at the ``chosen`` [b, l] positions T, the other masked
        positions summed out as ``draw`` sums them (``contraction="head"``, temperature 1): the exact
        log-likelihood of what a served step draws, differentiable (distillation fits a student with it).
        -> [b]."""
        ...

    def component_weights(self, head: OutputHead, h: torch.Tensor, masked: torch.Tensor,
                          temperature: float) -> torch.Tensor:
        """The single-position marginal of every masked position as a mixture of its E head outputs:
        p(x^i | x_t) = sum_e w_{i,e} softmax_x(output e of position i), S = the known positions (Eqs. 14-17).
        Returns w [m, E] (rows sum to 1, float64, row-major over ``masked``), computed without the head's
        E x V outputs; exact for rank 1 and CP, for TT with respect to the joint whose summed cores are
        the contracted-core head's Gbar_j (temperature 1). The fast adaptive step chooses by it."""
        ...

    def sums_exactly(self, contraction: str, temperature: float, joint: bool, adaptive: bool) -> bool:
        """Whether a step with these settings sums the full head outputs of every masked position (TT: the
        exact contraction, a temperature other than 1, or the rank-1 view of a predetermined step)."""
        ...

    def summing_values(self, rank: int, out_vocab: int) -> int:
        """Head-output values a summing step holds at once whatever its number of sequences (0 when it never
        sums); the cost model prices them."""
        ...


class SumsNothing:
    """For a format without an exact contraction to choose (rank 1, CP): no step sums full head outputs."""

    contractions = ("head",)

    @staticmethod
    def sums_exactly(contraction: str, temperature: float, joint: bool, adaptive: bool) -> bool:
        return False

    @staticmethod
    def summing_values(rank: int, out_vocab: int) -> int:
        return 0


@runtime_checkable
class Denoiser(Protocol):
    """The model interface of ``ttcore.sampling`` (``JointModel`` implements it, and the tests' explicit
    models): ``cfg`` (``dit.vocab_size`` / ``dit.length``), its ``format`` (a ``Decomposition``) and the
    ``head`` module the format built."""

    cfg: object
    format: Decomposition
    head: OutputHead

    def features(self, x_t: torch.Tensor) -> torch.Tensor:
        """x_t [b, l] -> features [b, l, d]: the one backbone call of a denoising step."""
        ...

    def head_outputs(self, h: torch.Tensor, mask: torch.Tensor) -> HeadOutputs:
        """The head on the masked positions: h [b, l, d], mask [b, l] -> HeadOutputs."""
        ...
