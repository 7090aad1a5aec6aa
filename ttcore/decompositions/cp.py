"""CP (Sec. 4.1): a mixture of r factorized components. Head: r outputs per masked position
(factors, Eq. 7) and r mixture-weight logits per sequence from the mean-pooled features."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ttcore.distributions import CP, sample_categorical, softmax64

from .base import SumsNothing
from .common import per_sequence
from .factorized import draw_from_components


def cp_masked_log_prob(weight_logits: torch.Tensor, factor_logits: torch.Tensor, targets: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """log sum_a w_a prod_{i in M} p^(a,i)(x^i) (Eq. 6; known positions are one-hot, factor 1).
    weight_logits [b, r], factor_logits [m, r, v] -> [b]."""
    log_f = F.log_softmax(factor_logits, -1)
    log_f = log_f.gather(-1, targets[:, None, None].expand(-1, log_f.shape[1], 1)).squeeze(-1)  # [m, r]
    return torch.logsumexp(F.log_softmax(weight_logits, -1) + per_sequence(log_f, mask), -1)


def cp_masked_marginal_log_probs(weight_logits: torch.Tensor, factor_logits: torch.Tensor,
                                 targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(x^i | x_t) = log sum_a w_a p^(a,i)(x^i) for each masked i (Eqs. 14-15, S = the known
    positions, whose factors are one-hot at their own token and so equal 1). -> [m]."""
    log_f = F.log_softmax(factor_logits, -1)
    log_f = log_f.gather(-1, targets[:, None, None].expand(-1, log_f.shape[1], 1)).squeeze(-1)  # [m, r]
    log_w = F.log_softmax(weight_logits, -1)[mask.nonzero()[:, 0]]  # [m, r]: each position's sequence
    return torch.logsumexp(log_w + log_f, -1)


@dataclass
class CPOutputs:
    """``factor_logits`` [m, r, v] per masked position, ``weight_logits`` [b, r] per sequence."""
    mask: torch.Tensor
    factor_logits: torch.Tensor
    weight_logits: torch.Tensor

    def joint(self, tokens: torch.Tensor, temperature: float = 1.0) -> CP:
        """float32 (full factors of every masked position; each draw renormalizes in float64)."""
        return CP.from_masked(torch.softmax(self.weight_logits / temperature, -1),
                              torch.softmax(self.factor_logits / temperature, -1), tokens, self.mask)

    def log_prob(self, x0: torch.Tensor) -> torch.Tensor:
        return cp_masked_log_prob(self.weight_logits, self.factor_logits, x0[self.mask], self.mask)

    def marginal_log_probs(self, x0: torch.Tensor) -> torch.Tensor:
        return cp_masked_marginal_log_probs(self.weight_logits, self.factor_logits, x0[self.mask], self.mask)

    def auxiliary_loss(self) -> torch.Tensor:
        return self.factor_logits.new_zeros(())


class CPDecomposition(SumsNothing):
    name, preference = "cp", 1
    joint_head, contractions, chain_rule_bytes = True, ("head",), 4

    @staticmethod
    def outputs_per_position(rank: int) -> int:
        return rank

    @staticmethod
    def extra_heads(hidden_dim: int, rank: int) -> dict:
        weights = nn.Linear(hidden_dim, rank)  # w(x_t) from mean-pooled features
        nn.init.zeros_(weights.weight)
        nn.init.zeros_(weights.bias)
        return {"weights": weights}

    @staticmethod
    def head_outputs(model, h: torch.Tensor, mask: torch.Tensor) -> CPOutputs:
        factors = model.head.component_logits(h[mask], model.output_layer.linear).float()  # [m, r, v]
        return CPOutputs(mask, factors, model.head.weights(h.mean(1)).float())

    @staticmethod
    def predetermined_step(model, h, x, masked, chosen, temperature, generator, contraction) -> torch.Tensor:
        """Eq. 18: a component per sequence, then each x^j from that component's factor (computed for
        that component only). Needs ``model.cp_weight_logits``."""
        component = sample_categorical(softmax64(model.cp_weight_logits(h), temperature), generator)
        return draw_from_components(model, h, x, chosen, component, temperature, generator)

    @staticmethod
    def component_weights(model, h, masked, temperature) -> torch.Tensor:
        """The mixture weights w_a of each masked position's sequence (Eqs. 14-15: the known positions'
        one-hot factors equal 1), tempered as ``predetermined_step`` draws the component."""
        return softmax64(model.cp_weight_logits(h), temperature)[masked.nonzero()[:, 0]]  # [m, r]

    @staticmethod
    def chosen_marginals(model, h, masked, chosen, temperature, contraction) -> torch.Tensor:
        """sum_a w_a p^(a,i)(x) (Eqs. 14-15, S = the known positions: their one-hot factors equal 1), the
        r factors of the chosen positions only."""
        r = model.cfg.rank
        weights = softmax64(model.cp_weight_logits(h), temperature)[chosen.nonzero()[:, 0]]  # [m, r]
        start = torch.zeros(int(chosen.sum()), dtype=torch.long, device=h.device)
        factors = softmax64(model.select_logits(h[chosen], start, r), temperature)  # [m, r, v]
        return torch.einsum("ma,mav->mv", weights, factors)
