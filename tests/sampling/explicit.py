"""Fixed tiny 'models' whose p(x | x_t) is written down explicitly, for exact sampler tests.

Features carry (x_t, position) so the heads know where each masked row sits. They implement the
interface the sampler uses: cfg, features, head_outputs, head.contracted.
"""

import itertools
from types import SimpleNamespace

import torch
from torch import nn

from ttcore.models import HeadOutputs


class _Explicit(nn.Module):
    def __init__(self, v: int, l: int, decomposition: str, rank: int):
        super().__init__()
        self.cfg = SimpleNamespace(dit=SimpleNamespace(vocab_size=v + 1, length=l), decomposition=decomposition,
                                   rank=rank)
        self._device = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.calls = 0

    def features(self, x):  # [b, l] -> [b, l, 2]
        self.calls += 1
        pos = torch.arange(x.shape[1]).expand_as(x)
        return torch.stack([x, pos], -1).double()


class ExplicitTT(_Explicit):
    """p(x | x_t) = the TT with fixed cores [l, v, r, r] on the masked positions (known: delta * I)."""

    def __init__(self, cores: torch.Tensor):
        l, v, r, _ = cores.shape
        super().__init__(v, l, "tt", r)
        self.cores = cores
        self.head = SimpleNamespace(contracted=lambda h: self.cores[h[:, 1].long()].sum(1).log())

    def head_outputs(self, h, mask):
        pos = h[..., 1][mask].long()
        return HeadOutputs(mask, self.cores[pos].log(), contracted_logits=None)


class ExplicitCP(_Explicit):
    def __init__(self, weights: torch.Tensor, factors: torch.Tensor):  # [r], [l, r, v]
        l, r, v = factors.shape
        super().__init__(v, l, "cp", r)
        self.weights, self.factors = weights, factors

    def head_outputs(self, h, mask):
        pos = h[..., 1][mask].long()
        return HeadOutputs(mask, self.factors[pos].log(), weight_logits=self.weights.log().expand(h.shape[0], -1))


class PerfectMarginals(_Explicit):
    """Rank 1: p(x^i | x_t) = the exact conditional marginal of a fixed dense joint P given the
    unmasked tokens of x_t, as a perfectly trained MDM would predict."""

    def __init__(self, p: torch.Tensor, v: int, l: int):
        super().__init__(v, l, "none", 1)
        self.seqs = torch.tensor(list(itertools.product(range(v), repeat=l)))  # [v^l, l]
        self.p, self.v = p, v

    def conditional_marginals(self, x):  # [b, l] -> [b, l, v]
        known = x < self.v
        consistent = ((self.seqs[None] == x[:, None]) | ~known[:, None]).all(-1)  # [b, v^l]
        w = consistent.double() * self.p[None]
        onehot = torch.nn.functional.one_hot(self.seqs, self.v).double()  # [v^l, l, v]
        m = torch.einsum("bs,slv->blv", w, onehot)
        return m / m.sum(-1, keepdim=True)

    def head_outputs(self, h, mask):
        x = h[..., 0].long()
        return HeadOutputs(mask, self.conditional_marginals(x)[mask].clamp_min(1e-300).log())
