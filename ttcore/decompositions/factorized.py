"""Rank 1, the standard MDM (Eq. 2): p(x | x_t) = prod_i p(x^i | x_t); the base model's head W."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ttcore.distributions import Factorized, Site, entry_rows, sample_categorical, softmax64, uniforms

from .base import SumsNothing
from .common import output_dtype, per_sequence
from .heads import BaseHead


def factorized_masked_log_prob(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_{i in M} log p(x^i | x_t) (Eq. 4). logits [m, v], targets [m] -> [b]."""
    return per_sequence(-F.cross_entropy(logits, targets, reduction="none"), mask)


@dataclass
class FactorizedOutputs:
    """One distribution per masked position: ``logits`` [m, v]."""
    mask: torch.Tensor
    logits: torch.Tensor

    def joint(self, tokens: torch.Tensor, temperature: float = 1.0) -> Factorized:
        return Factorized.from_masked(softmax64(self.logits, temperature, rows=entry_rows(temperature, self.mask)),
                                      tokens, self.mask)

    def log_prob(self, x0: torch.Tensor) -> torch.Tensor:
        return factorized_masked_log_prob(self.logits, x0[self.mask], self.mask)

    def marginal_log_probs(self, x0: torch.Tensor) -> torch.Tensor:
        return -F.cross_entropy(self.logits, x0[self.mask], reduction="none")

    def auxiliary_loss(self) -> torch.Tensor:
        return self.logits.new_zeros(())


def draw_from_components(head, h: torch.Tensor, x: torch.Tensor, chosen: torch.Tensor, component: torch.Tensor,
                         temperature, generator, u: torch.Tensor | None = None) -> torch.Tensor:
    """Independent draws at the chosen positions [b, l], each from head output ``component`` [b] of its
    sequence (rank 1: 0), computed for the chosen positions only; position i's uniform is lane i of
    ``Site.draw`` (or of ``u`` [b, >= l], taken by the caller). -> [b, l], -1 elsewhere."""
    values = torch.full_like(x, -1)
    u = (uniforms(generator, *x.shape, x.device, Site.draw) if u is None else u[:, :x.shape[1]])[chosen]  # [m]
    rows_of = chosen.nonzero()[:, 0]  # [m] batch row of each chosen position
    logits = head.select_logits(h[chosen], component[rows_of], 1)[:, 0]  # [m, v]
    values[chosen] = sample_categorical(softmax64(logits, temperature, rows=rows_of), u=u)
    return values


class Rank1(SumsNothing):
    """The MDM's own head: one output per position, independent draws (Eq. 2)."""

    name, joint_head, joint_dtype = "none", False, torch.float64
    chains = True  # a chain of its cores (Factorized: diagonal)

    def outputs_per_position(self, rank: int) -> int:
        return 1

    def build_head(self, rank, kind, hidden_dim, out_vocab, base) -> BaseHead:
        if rank != 1:
            raise ValueError(f"decomposition 'none' is rank 1, got rank {rank}")
        return BaseHead(base)

    def outputs(self, head, h: torch.Tensor, mask: torch.Tensor) -> FactorizedOutputs:
        return FactorizedOutputs(mask, output_dtype(head.component_logits(h[mask])[:, 0]))

    def draw(self, head, h, x, masked, chosen, temperature, generator, contraction) -> torch.Tensor:
        """MDLM: independent draws."""
        component = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return draw_from_components(head, h, x, chosen, component, temperature, generator)

    def component_weights(self, head, h, masked, temperature) -> torch.Tensor:
        """One output per position, the marginal itself (Eq. 2)."""
        return torch.ones(int(masked.sum()), 1, dtype=torch.float64, device=h.device)

    def chosen_log_prob(self, head, h, masked, chosen, x) -> torch.Tensor:
        """Eq. 2 over T: the other positions' factors sum to 1."""
        return self.outputs(head, h, chosen).log_prob(x)

    def marginals_at(self, head, h, masked, chosen, temperature, contraction) -> torch.Tensor:
        """Eq. 2's factors themselves."""
        return softmax64(head.component_logits(h[chosen])[:, 0], temperature, rows=entry_rows(temperature, chosen))
