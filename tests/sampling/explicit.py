"""Fixed tiny 'models' whose p(x | x_t) is written down explicitly, for exact sampler tests.

Features carry (position, x_t) at every position, so a head applied to some rows knows where they
sit and what the whole input is. They implement the interface the sampler uses: cfg, features,
head_outputs (all E outputs on a mask), select_logits, gather_logits, cp_weight_logits, contracted_cores, core_logits.
"""

import itertools
from types import SimpleNamespace

import torch
from torch import nn

from ttcore.decompositions import CPOutputs, FactorizedOutputs, TTOutputs


class _Explicit(nn.Module):
    def __init__(self, v: int, l: int, decomposition: str, rank: int):
        super().__init__()
        self.cfg = SimpleNamespace(dit=SimpleNamespace(vocab_size=v + 1, length=l), decomposition=decomposition,
                                   rank=rank)
        self._device = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.calls = 0

    def features(self, x):  # [b, l] -> [b, l, 1 + l]: (position, x_t)
        self.calls += 1
        b, l = x.shape
        pos = torch.arange(l).expand(b, l)
        return torch.cat([pos[..., None], x[:, None, :].expand(b, l, l)], -1).double()

    @staticmethod
    def _pos(h):
        return h[..., 0].long()

    def gather_logits(self, h, outputs):  # any outputs [n, c] of each row: [n, c, v]
        return torch.cat([self.select_logits(h, outputs[:, i], 1) for i in range(outputs.shape[1])], 1)


class ExplicitTT(_Explicit):
    """p(x | x_t) = the TT with fixed cores [l, v, r, r] on the masked positions (known: delta * I)."""

    def __init__(self, cores: torch.Tensor):
        l, v, r, _ = cores.shape
        super().__init__(v, l, "tt", r)
        self.cores = cores

    def head_outputs(self, h, mask):
        return TTOutputs(mask, self.cores[self._pos(h[mask])].log())

    def select_logits(self, h, start, count):  # outputs e = j * r + k in [start, start + count): [n, count, v]
        r = self.cfg.rank
        e = start[:, None] + torch.arange(count)  # [n, count]
        return self.cores[self._pos(h)[:, None], :, e // r, e % r].log()

    def contracted_cores(self, h):
        return self.cores[self._pos(h)].sum(1)

    def core_logits(self, h):  # [n, v, r, r]
        return self.cores[self._pos(h)].log()


class ExplicitCP(_Explicit):
    def __init__(self, weights: torch.Tensor, factors: torch.Tensor):  # [r], [l, r, v]
        l, r, v = factors.shape
        super().__init__(v, l, "cp", r)
        self.weights, self.factors = weights, factors

    def head_outputs(self, h, mask):
        return CPOutputs(mask, self.factors[self._pos(h[mask])].log(), self.weights.log().expand(h.shape[0], -1))

    def select_logits(self, h, start, count):  # components start .. start + count - 1: [n, count, v]
        return self.factors[self._pos(h)[:, None], start[:, None] + torch.arange(count)].log()

    def cp_weight_logits(self, h):
        return self.weights.log().expand(h.shape[0], -1)


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

    def _logits(self, h):  # h [n, 1 + l] -> [n, v]
        marg = self.conditional_marginals(h[:, 1:].long())  # [n, l, v]
        return marg[torch.arange(len(h)), self._pos(h)].clamp_min(1e-300).log()

    def head_outputs(self, h, mask):
        return FactorizedOutputs(mask, self._logits(h[mask]))

    def select_logits(self, h, start, count):
        return self._logits(h).unsqueeze(1)
