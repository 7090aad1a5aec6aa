"""The standard MDM joint: p(x | x_t) = prod_i p(x^i | x_t) (Eq. 2), the rank-1 case of CP and TT."""

import torch

from ._checks import check_float, check_masked, check_ndim, check_positions, check_simplex, check_tokens
from .categorical import sample_categorical


class Factorized:
    """Independent categoricals. ``probs`` [b, l, v], each row on the simplex."""

    def __init__(self, probs: torch.Tensor, validate: bool = True):
        check_float("probs", probs)
        check_ndim("probs", probs, "b, l, v")
        if validate:
            check_simplex("probs", probs, (-1,), "v")
        self.probs = probs
        self.b, self.l, self.v = probs.shape

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> "Factorized":
        """logits [b, l, v] -> softmax over v."""
        return cls(torch.softmax(logits, dim=-1), validate=False)

    @classmethod
    def from_masked(cls, probs_masked: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> "Factorized":
        """Full-length joint from head outputs on masked positions only.

        probs_masked [m, v] rows for the True entries of ``mask`` [b, l] (row-major order); known
        positions get the one-hot of ``tokens`` [b, l].
        """
        check_masked(tokens, mask, probs_masked.shape[0])
        v = probs_masked.shape[-1]
        probs = torch.nn.functional.one_hot(tokens.clamp(0, v - 1), v).to(probs_masked.dtype)  # [b, l, v]
        probs[mask] = probs_masked
        return cls(probs, validate=False)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, l] -> [b]: sum_i log p(x^i)."""
        check_tokens("x", x, self.b, self.l, self.v, allow_free=False)
        return self.probs.gather(-1, x.unsqueeze(-1)).squeeze(-1).log().sum(-1)

    def marginals(self, x_cond: torch.Tensor) -> torch.Tensor:
        """x_cond [b, l] (-1 = free) -> [b, l, v]; independence makes conditioning trivial."""
        check_tokens("x_cond", x_cond, self.b, self.l, self.v, allow_free=True)
        known = x_cond >= 0
        onehot = torch.nn.functional.one_hot(x_cond.clamp_min(0), self.v).to(self.probs.dtype)
        return torch.where(known.unsqueeze(-1), onehot, self.probs)

    def chain(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """r = 1: s = 1, G_i(x) = p(x^i = x)."""
        return self.probs.new_ones(self.b, 1), self.probs[..., None], True

    def sample(self, positions: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Independent draws at ``positions`` [b, l] (all when None); -1 elsewhere."""
        positions = check_positions(positions, self.b, self.l, self.probs.device)
        x = torch.full((self.b, self.l), -1, dtype=torch.long, device=self.probs.device)
        x[positions] = sample_categorical(self.probs[positions], generator)  # only the chosen rows
        return x
