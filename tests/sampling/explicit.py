"""Fixed tiny 'models' whose p(x | x_t) is written down explicitly, for exact sampler tests.

Features carry (position, x_t) at every position, so a head applied to some rows knows where they
sit and what the whole input is. They implement the interface the sampler uses (``Denoiser``): cfg,
features, head_outputs, the registered ``format`` and a ``head`` answering what that format asks of its head
(select_logits, gather_logits, component_logits; CP: weight_logits; TT: core_logits, contracted_logits,
contracted_cores).
"""

import itertools
from types import SimpleNamespace

import torch
from torch import nn

from ttcore.decompositions import get_decomposition
from ttcore.kinds import DIFFUSION


def _pos(h):
    return h[..., 0].long()


class _ExplicitHead:
    """Outputs e of each position over ``out_vocab`` values, from a table ``logits_of(h) -> [n, E, v]``."""

    def __init__(self, rank: int, e: int, out_vocab: int, logits_of):
        self.rank, self.e, self.out_vocab, self.logits_of = rank, e, out_vocab, logits_of

    def component_logits(self, h):
        return self.logits_of(h)

    def select_logits(self, h, start, count):  # outputs [start, start + count): [n, count, v]
        idx = start[:, None] + torch.arange(count)
        return self.logits_of(h)[torch.arange(len(h))[:, None], idx]

    def gather_logits(self, h, outputs):  # any outputs [n, c] of each row: [n, c, v]
        return self.logits_of(h)[torch.arange(len(h))[:, None], outputs]


class _Explicit(nn.Module):
    def __init__(self, v: int, l: int, decomposition: str, rank: int):
        super().__init__()
        self.format = get_decomposition(decomposition)
        self.cfg = SimpleNamespace(dit=SimpleNamespace(vocab_size=v + 1, length=l, out_vocab=v, mask_id=v),
                                   decomposition=decomposition, rank=rank, format=self.format, kind=DIFFUSION)
        self._device = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.calls = 0

    def features(self, x):  # [b, l] -> [b, l, 1 + l]: (position, x_t)
        self.calls += 1
        b, l = x.shape
        pos = torch.arange(l).expand(b, l)
        return torch.cat([pos[..., None], x[:, None, :].expand(b, l, l)], -1).double()

    def head_outputs(self, h, mask):
        return self.format.outputs(self.head, h, mask)


class ExplicitTT(_Explicit):
    """p(x | x_t) = the TT with fixed cores [l, v, r, r] on the masked positions (known: delta * I); its
    contracted-core "head" predicts the cores' exact sums."""

    def __init__(self, cores: torch.Tensor, all_at_once: bool = True):
        l, v, r, _ = cores.shape
        super().__init__(v, l, "tt", r)
        self.cores = cores
        head = _ExplicitHead(r, r * r, v, lambda h: cores[_pos(h)].log().permute(0, 2, 3, 1).reshape(len(h), r * r, v))
        head.gathers_all = lambda h: all_at_once  # a draw's core rows: all chosen positions' at once, or each's own
        head.core_logits = lambda h: cores[_pos(h)].log()  # [n, v, r, r]
        head.contracted_cores = lambda h: cores[_pos(h)].sum(1)
        head.contracted_logits = lambda h: cores[_pos(h)].sum(1).log()
        self.head = head


class ExplicitCP(_Explicit):
    def __init__(self, weights: torch.Tensor, factors: torch.Tensor):  # [r], [l, r, v]
        l, r, v = factors.shape
        super().__init__(v, l, "cp", r)
        self.weights, self.factors = weights, factors
        head = _ExplicitHead(r, r, v, lambda h: factors[_pos(h)].log())
        head.weight_logits = lambda h: weights.log().expand(h.shape[0], -1)
        self.head = head


class PerfectMarginals(_Explicit):
    """Rank 1: p(x^i | x_t) = the exact conditional marginal of a fixed dense joint P given the
    unmasked tokens of x_t, as a perfectly trained MDM would predict."""

    def __init__(self, p: torch.Tensor, v: int, l: int):
        super().__init__(v, l, "none", 1)
        self.seqs = torch.tensor(list(itertools.product(range(v), repeat=l)))  # [v^l, l]
        self.p, self.v = p, v
        self.head = _ExplicitHead(1, 1, v, lambda h: self._logits(h).unsqueeze(1))

    def conditional_marginals(self, x):  # [b, l] -> [b, l, v]
        known = x < self.v
        consistent = ((self.seqs[None] == x[:, None]) | ~known[:, None]).all(-1)  # [b, v^l]
        w = consistent.double() * self.p[None]
        onehot = torch.nn.functional.one_hot(self.seqs, self.v).double()  # [v^l, l, v]
        m = torch.einsum("bs,slv->blv", w, onehot)
        return m / m.sum(-1, keepdim=True)

    def _logits(self, h):  # h [n, 1 + l] -> [n, v]
        marg = self.conditional_marginals(h[:, 1:].long())  # [n, l, v]
        return marg[torch.arange(len(h)), _pos(h)].clamp_min(1e-300).log()
