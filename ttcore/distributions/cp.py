"""Canonical Polyadic joint (Sec. 4.1, Eq. 6): p(x | x_t) = sum_a w_a prod_i p^(a, i)(x^i | x_t).

weights [b, r] on the simplex, factors [b, l, r, v] on the simplex over v (Eq. 7). A mixture of r
factorized components; rank 1 is the standard MDM.
"""

import torch

from ._checks import check_float, check_masked, check_ndim, check_positions, check_simplex, check_tokens
from ._precision import own_precision
from .categorical import sample_categorical


@own_precision
def cp_log_prob(weights: torch.Tensor, factors: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log sum_a w_a prod_i f_{i,a}(x^i)  (Eq. 6), in log space. -> [b]."""
    idx = x[:, :, None, None].expand(-1, -1, factors.shape[2], 1)  # [b, l, r, 1]
    log_f = factors.gather(-1, idx).squeeze(-1).log()  # [b, l, r]
    return torch.logsumexp(weights.log() + log_f.sum(1), dim=-1)


@own_precision
def cp_posterior(weights: torch.Tensor, factors: torch.Tensor, x_cond: torch.Tensor) -> torch.Tensor:
    """Component posterior p(a | x_S) from the conditioning factors of Sec. 4.3 (Eq. 14). -> [b, r].

    prod_j pbar^(a, j) is accumulated in log space and normalized by a softmax over a, so
    p(x_S) is never divided by.
    """
    known = (x_cond >= 0)[:, :, None]  # [b, l, 1]
    idx = x_cond.clamp_min(0)[:, :, None, None].expand(-1, -1, factors.shape[2], 1)  # [b, l, r, 1]
    log_f = factors.gather(-1, idx).squeeze(-1).log()  # [b, l, r]
    log_cond = torch.where(known, log_f, torch.zeros_like(log_f)).sum(1)  # [b, r]
    return torch.softmax(weights.log() + log_cond, dim=-1)


@own_precision
def cp_marginals(weights: torch.Tensor, factors: torch.Tensor, x_cond: torch.Tensor) -> torch.Tensor:
    """p(x^i | x_S) ∝ sum_a w_a p^(a,i)(x^i) prod_j pbar^(a,j)  (Eq. 15). -> [b, l, v]."""
    post = cp_posterior(weights, factors, x_cond)  # [b, r]
    marg = torch.einsum("br,blrv->blv", post, factors)
    known = (x_cond >= 0).unsqueeze(-1)
    onehot = torch.nn.functional.one_hot(x_cond.clamp_min(0), factors.shape[-1]).to(factors.dtype)
    return torch.where(known, onehot, marg)


class CP:
    """CP joint with ``weights`` [b, r] and ``factors`` [b, l, r, v]."""

    def __init__(self, weights: torch.Tensor, factors: torch.Tensor, validate: bool = True):
        check_float("weights", weights)
        check_float("factors", factors)
        check_ndim("weights", weights, "b, r")
        check_ndim("factors", factors, "b, l, r, v")
        b, l, r, v = factors.shape
        if tuple(weights.shape) != (b, r):
            raise ValueError(f"weights must have shape [b, r] = [{b}, {r}] to match factors, "
                             f"got {tuple(weights.shape)}")
        if validate:
            check_simplex("weights", weights, (-1,), "r")
            check_simplex("factors", factors, (-1,), "v")
        self.weights, self.factors = weights, factors
        self.b, self.l, self.r, self.v = b, l, r, v

    @classmethod
    def from_logits(cls, weight_logits: torch.Tensor, factor_logits: torch.Tensor) -> "CP":
        """weight_logits [b, r] -> softmax over r; factor_logits [b, l, r, v] -> softmax over v."""
        return cls(torch.softmax(weight_logits, -1), torch.softmax(factor_logits, -1), validate=False)

    @classmethod
    def from_masked(cls, weights: torch.Tensor, factors_masked: torch.Tensor, tokens: torch.Tensor,
                    mask: torch.Tensor) -> "CP":
        """Full-length CP from head outputs on masked positions: factors_masked [m, r, v] for the True
        entries of ``mask`` [b, l]; a known position has the one-hot of its token in every component."""
        check_masked(tokens, mask, factors_masked.shape[0])
        _, r, v = factors_masked.shape
        onehot = torch.nn.functional.one_hot(tokens.clamp(0, v - 1), v).to(factors_masked.dtype)  # [b, l, v]
        factors = onehot.unsqueeze(2).repeat(1, 1, r, 1)  # [b, l, r, v]
        factors[mask] = factors_masked
        return cls(weights, factors, validate=False)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, l] -> [b]."""
        check_tokens("x", x, self.b, self.l, self.v, allow_free=False)
        return cp_log_prob(self.weights, self.factors, x)

    def marginals(self, x_cond: torch.Tensor) -> torch.Tensor:
        """x_cond [b, l] (-1 = free) -> p(x^i | x_S) [b, l, v], one-hot where conditioned."""
        check_tokens("x_cond", x_cond, self.b, self.l, self.v, allow_free=True)
        return cp_marginals(self.weights, self.factors, x_cond)

    def chain(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """s = w, diagonal cores G_i(x) = diag(p^(a, i)(x)) over the components a: [b, l, v, r]."""
        return self.weights, self.factors.transpose(2, 3), True

    def sample(self, positions: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact joint draw at ``positions`` [b, l] (Eq. 18): a component a ~ w, then each chosen
        position from p^(a, i). Other positions are marginalized out and returned as -1."""
        positions = check_positions(positions, self.b, self.l, self.factors.device)
        a = sample_categorical(self.weights, generator)  # [b]
        rows, cols = positions.nonzero(as_tuple=True)  # the chosen (row, position) pairs
        x = torch.full((self.b, self.l), -1, dtype=torch.long, device=positions.device)
        x[rows, cols] = sample_categorical(self.factors[rows, cols, a[rows]], generator)  # [m] from component a
        return x
