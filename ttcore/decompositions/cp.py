"""CP (Sec. 4.1): a mixture of r factorized components. Head: r outputs per masked position
(factors, Eq. 7) and r mixture-weight logits per sequence from the mean-pooled features."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ttcore.distributions import (
    CP,
    Site,
    entry_rows,
    is_one,
    sample_categorical,
    softmax64,
    tempered,
    tempered_log_normalizer,
    uniforms,
)

from .base import SumsNothing
from .common import output_dtype, per_sequence
from .factorized import draw_from_components
from .heads import ComponentHead, zero_linear


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


def cp_tempered_weight_logits(weight_logits: torch.Tensor, factor_logits: torch.Tensor | None, mask: torch.Tensor,
                              temperature) -> torch.Tensor:
    """The mixture weights of the CP joint at temperature T, as logits (float64): the joint of the component a
    and the masked tokens, tempered, q_T(a, x_M) ∝ (w_a prod_{i in M} p^(a,i)(x^i))^(1/T) (Eq. 6), is again a
    CP with factors softmax(logits / T) and weights

        log w'_a = log w_a / T + sum_{i in M} log sum_x p^(a,i)(x)^(1/T)   (``tempered_log_normalizer``),

    so a component whose factors are sharp gains weight as T falls, and T -> 0 draws the best (a, x_M) pair
    (docs: concepts, temperature). T = 1: the weight logits as they are (``factor_logits`` may be None).
    weight_logits [b, r], factor_logits [m, r, v] at the True entries of ``mask`` [b, l] -> [b, r]."""
    if is_one(temperature):
        return weight_logits.double()
    log_w = F.log_softmax(weight_logits.double(), -1)
    log_z = tempered_log_normalizer(factor_logits.double(), temperature, entry_rows(temperature, mask))  # [m, r]
    return tempered(log_w, temperature) + per_sequence(log_z, mask)


@dataclass
class CPOutputs:
    """``factor_logits`` [m, r, v] per masked position, ``weight_logits`` [b, r] per sequence."""
    mask: torch.Tensor
    factor_logits: torch.Tensor
    weight_logits: torch.Tensor

    def joint(self, tokens: torch.Tensor, temperature: float = 1.0) -> CP:
        """float32 (full factors of every masked position; each draw renormalizes in float64)."""
        rows = entry_rows(temperature, self.mask)
        weights = torch.softmax(self.weight_logits, -1) if is_one(temperature) else torch.softmax(
            cp_tempered_weight_logits(self.weight_logits, self.factor_logits, self.mask, temperature), -1).to(
            self.factor_logits.dtype)
        return CP.from_masked(weights, torch.softmax(tempered(self.factor_logits, temperature, rows), -1), tokens,
                              self.mask)

    def log_prob(self, x0: torch.Tensor) -> torch.Tensor:
        return cp_masked_log_prob(self.weight_logits, self.factor_logits, x0[self.mask], self.mask)

    def marginal_log_probs(self, x0: torch.Tensor) -> torch.Tensor:
        return cp_masked_marginal_log_probs(self.weight_logits, self.factor_logits, x0[self.mask], self.mask)

    def auxiliary_loss(self) -> torch.Tensor:
        return self.factor_logits.new_zeros(())


class CPHead(ComponentHead):
    """r factors per masked position (``ComponentHead``) and the mixture weights w(x_t) from the
    mean-pooled features of each sequence (``weights``, zero-initialized: uniform)."""

    per_sequence = ("weights",)
    aux = ("weights",)

    def __init__(self, rank, kind, hidden_dim, out_vocab, base):
        super().__init__(rank, rank, kind, hidden_dim, out_vocab, base)
        self.weights = zero_linear(hidden_dim, rank)

    def grown_sources(self, rank: int) -> torch.Tensor:
        """Component c copies component c // m of the rank-r head (m = R / r), its weight logit too: m equal
        components of weight w / m each."""
        return torch.arange(self.rank) // (self.rank // rank)

    def weight_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The mixture weights' logits from the features of whole sequences: h [b, l, d] -> [b, r] float32
        (float64 for a float64 model)."""
        return output_dtype(self.weights(h.mean(1)))


class CPDecomposition(SumsNothing):
    name, joint_head, joint_dtype = "cp", True, torch.float32
    chains = True

    def outputs_per_position(self, rank: int) -> int:
        return rank

    def build_head(self, rank, kind, hidden_dim, out_vocab, base) -> CPHead:
        return CPHead(rank, kind, hidden_dim, out_vocab, base)

    def outputs(self, head, h: torch.Tensor, mask: torch.Tensor) -> CPOutputs:
        return CPOutputs(mask, output_dtype(head.component_logits(h[mask])), head.weight_logits(h))

    def draw(self, head, h, x, masked, chosen, temperature, generator, contraction) -> torch.Tensor:
        """Eq. 18: a component per sequence, then each x^j from that component's factor (computed for
        that component only); one call for all the uniforms."""
        b, l = x.shape
        u = uniforms(generator, b, l + 1, x.device, Site.draw)  # lanes 0..l-1: the positions; lane l: the component
        component = sample_categorical(self._weights(head, h, masked, temperature), u=u[:, l])
        return draw_from_components(head, h, x, chosen, component, temperature, generator, u)

    @staticmethod
    def _weights(head, h, masked, temperature, factors: torch.Tensor | None = None) -> torch.Tensor:
        """The mixture weights of the tempered joint (``cp_tempered_weight_logits``), float64 [b, r]; away from
        T = 1 they need every masked position's r factor logits (``factors`` [m, r, v], computed when None)."""
        if factors is None and not is_one(temperature):
            factors = head.component_logits(h[masked])
        return torch.softmax(cp_tempered_weight_logits(head.weight_logits(h), factors, masked, temperature), -1)

    def component_weights(self, head, h, masked, temperature) -> torch.Tensor:
        """The mixture weights w_a of each masked position's sequence (Eqs. 14-15: the known positions'
        one-hot factors equal 1), tempered as ``draw`` draws the component."""
        return self._weights(head, h, masked, temperature)[masked.nonzero()[:, 0]]  # [m, r]

    def chosen_log_prob(self, head, h, masked, chosen, x) -> torch.Tensor:
        """Eq. 6 over T: a masked position outside T contributes its factors' sum, 1, in every component."""
        return self.outputs(head, h, chosen).log_prob(x)

    def marginals_at(self, head, h, masked, chosen, temperature, contraction) -> torch.Tensor:
        """sum_a w_a p^(a,i)(x) (Eqs. 14-15, S = the known positions: their one-hot factors equal 1), the
        r factors of the chosen positions only; at T != 1 the tempered joint's (``cp_tempered_weight_logits``)."""
        rows = chosen.nonzero()[:, 0]
        if is_one(temperature):
            weights, logits = self._weights(head, h, masked, temperature), head.component_logits(h[chosen])
        else:  # the weights need every masked position's factors: the chosen ones are among them
            every = head.component_logits(h[masked])
            weights, logits = self._weights(head, h, masked, temperature, every), every[chosen[masked]]
        factors = softmax64(logits, temperature, rows=rows)  # [m, r, v]
        weights = weights[rows]  # [m, r]
        return torch.einsum("ma,mav->mv", weights, factors)
