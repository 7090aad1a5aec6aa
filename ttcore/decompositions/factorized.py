"""Rank 1, the standard MDM (Eq. 2): p(x | x_t) = prod_i p(x^i | x_t); the base model's head W."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ttcore.distributions import Factorized, sample_categorical, softmax64

from .base import SumsNothing
from .common import per_sequence


def factorized_masked_log_prob(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_{i in M} log p(x^i | x_t) (Eq. 4). logits [m, v], targets [m] -> [b]."""
    return per_sequence(-F.cross_entropy(logits, targets, reduction="none"), mask)


@dataclass
class FactorizedOutputs:
    """One distribution per masked position: ``logits`` [m, v]."""
    mask: torch.Tensor
    logits: torch.Tensor

    def joint(self, tokens: torch.Tensor, temperature: float = 1.0) -> Factorized:
        return Factorized.from_masked(softmax64(self.logits, temperature), tokens, self.mask)

    def log_prob(self, x0: torch.Tensor) -> torch.Tensor:
        return factorized_masked_log_prob(self.logits, x0[self.mask], self.mask)

    def marginal_log_probs(self, x0: torch.Tensor) -> torch.Tensor:
        return -F.cross_entropy(self.logits, x0[self.mask], reduction="none")

    def auxiliary_loss(self) -> torch.Tensor:
        return self.logits.new_zeros(())


def draw_from_components(model, h: torch.Tensor, x: torch.Tensor, chosen: torch.Tensor, component: torch.Tensor,
                         temperature: float, generator) -> torch.Tensor:
    """Independent draws at the chosen positions [b, l], each from head output ``component`` [b] of its
    sequence (rank 1: 0), computed for the chosen positions only. -> [b, l], -1 elsewhere."""
    values = torch.full_like(x, -1)
    rows_of = chosen.nonzero()[:, 0]  # [m] batch row of each chosen position
    logits = model.select_logits(h[chosen], component[rows_of], 1)[:, 0]  # [m, v]
    values[chosen] = sample_categorical(softmax64(logits, temperature), generator, rows_of)
    return values


class Rank1(SumsNothing):
    name, preference = "none", 0
    joint_head, contractions, chain_rule_bytes = False, ("head",), 8

    @staticmethod
    def outputs_per_position(rank: int) -> int:
        return 1

    @staticmethod
    def extra_heads(hidden_dim: int, rank: int) -> dict:
        return {}

    @staticmethod
    def head_outputs(model, h: torch.Tensor, mask: torch.Tensor) -> FactorizedOutputs:
        return FactorizedOutputs(mask, model.output_layer.linear(h[mask]).float())

    @staticmethod
    def predetermined_step(model, h, x, masked, chosen, temperature, generator, contraction) -> torch.Tensor:
        """MDLM: independent draws."""
        component = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return draw_from_components(model, h, x, chosen, component, temperature, generator)

    @staticmethod
    def component_weights(model, h, masked, temperature) -> torch.Tensor:
        """One output per position, the marginal itself (Eq. 2)."""
        return torch.ones(int(masked.sum()), 1, dtype=torch.float64, device=h.device)

    @staticmethod
    def chosen_marginals(model, h, masked, chosen, temperature, contraction) -> torch.Tensor:
        """Eq. 2's factors themselves."""
        start = torch.zeros(int(chosen.sum()), dtype=torch.long, device=h.device)
        return softmax64(model.select_logits(h[chosen], start, 1)[:, 0], temperature)
