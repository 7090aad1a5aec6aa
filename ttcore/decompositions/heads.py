"""The output heads a format builds (Sec. 4.5): the base MDM head W itself (rank 1) and the E-output head
that turns it into a CP / TT joint (each format's file subclasses it with its extra heads).

E outputs per position: E = r for CP (plus r weight logits per sequence), E = r*r for TT, laid out
as e = j * r + k. Heads run on masked positions only ([n, d] features).
- 1-layer: W' in H x (E*V) replaces the base W; initialized as E copies of W.
- 2-layer: W~ in H x (E*H) inserted before the frozen W, which is applied to each of the E outputs;
  initialized as E stacked identities.
Small Gaussian noise breaks the symmetry between the copies; with zero noise the joint model has the
base model's marginals and likelihood exactly.

A head reads the base W (the model's ``output_layer.linear``, which the checkpoint stores there) without
owning it: ``base`` is a reference, not a submodule, so the state dict keeps one copy of W.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ttcore.registry import Registry


@dataclass(frozen=True)
class HeadKind:
    """How a joint head makes its E outputs (Sec. 4.5). ``keeps_base``: its first matmul (W~, H x (E*H)) feeds
    the frozen base W on each output; otherwise the matmul W' (H x (E*V)) replaces W."""
    name: str
    keeps_base: bool
    description: str


HEAD_KINDS = Registry("head")
HEAD_KINDS.register(HeadKind("1layer", False, "W' in H x (E*V) replaces the base W, initialized as E copies of it"))
HEAD_KINDS.register(HeadKind("2layer", True, "W~ in H x (E*H) before the frozen W, initialized as E identities"))
GATHER_MAX_OUTPUTS = 8192  # select_logits: all E outputs then gather, up to this many outputs per row


class OutputHead(nn.Module):
    """What every format's head answers: ``e`` outputs per position over ``out_vocab`` values, any of them by
    index. ``base``: the model's W (None for a 1-layer joint head, which replaces it)."""

    e: int
    out_vocab: int
    per_sequence: tuple[str, ...] = ()  # submodules run once per sequence, not per masked position (FLOP counts)

    def __init__(self, rank: int, base: nn.Linear | None):
        super().__init__()
        self.rank = rank
        object.__setattr__(self, "_base_ref", base)  # not a submodule: W belongs to the model's output layer

    @property
    def base(self) -> nn.Linear | None:
        return self._base_ref

    def select_logits(self, h: torch.Tensor, start: torch.Tensor, count: int) -> torch.Tensor:
        """Outputs e in [start, start + count) of each row: h [n, d], start [n] -> [n, count, v], in the
        matmul's dtype (bf16 under autocast: the sampler's float32 softmax upcasts inside its kernel)."""
        raise NotImplementedError

    def gathers_all(self, h: torch.Tensor) -> bool:
        """Whether ``select_logits`` computes every output of a row anyway (a small head), so a draw may compute
        them once for all its positions. False: each selection pays for its own outputs only."""
        return False

    def gather_logits(self, h: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        """Any c outputs of each row: h [n, d], outputs [n, c] (indices into the E outputs) -> [n, c, v]."""
        raise NotImplementedError

    def component_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Every output: h [n, d] -> [n, e, v]."""
        raise NotImplementedError


class BaseHead(OutputHead):
    """Rank 1: the base head W, one output per position (Eq. 2). No parameters of its own."""

    e = 1

    def __init__(self, base: nn.Linear):
        super().__init__(1, base)
        self.out_vocab = base.out_features

    def select_logits(self, h, start, count):
        return self.base(h).unsqueeze(1)

    def gather_logits(self, h, outputs):
        return self.base(h).unsqueeze(1).expand(-1, outputs.shape[1], -1)

    def component_logits(self, h):
        return self.base(h).unsqueeze(1)


class ComponentHead(OutputHead):
    """E outputs per masked position from a 1-layer (W') or 2-layer (W~ then the frozen W) head."""

    aux: tuple[str, ...] = ()  # a format's extra heads whose outputs are indexed like the E outputs (grown alike)

    def __init__(self, e: int, rank: int, kind: str, hidden_dim: int, out_vocab: int, base: nn.Linear | None):
        if kind not in HEAD_KINDS:
            raise ValueError(f"head must be one of {', '.join(HEAD_KINDS)}, got {kind!r}")
        self.keeps_base = HEAD_KINDS[kind].keeps_base
        if self.keeps_base and base is None:
            raise ValueError(f"a {kind} head applies the base head W to each output: it needs W")
        super().__init__(rank, base if self.keeps_base else None)
        self.e, self.kind, self.out_vocab = e, kind, out_vocab
        self.gather_max_outputs = GATHER_MAX_OUTPUTS
        if self.keeps_base:
            self.mix = nn.Linear(hidden_dim, e * hidden_dim, bias=False)  # W~
        else:
            self.proj = nn.Linear(hidden_dim, e * out_vocab)  # W'

    @torch.no_grad()
    def init_from_base(self, base: nn.Linear, noise: float, generator: torch.Generator | None = None) -> None:
        """Preserve the base marginals: E copies of W (1-layer) or E stacked identities (2-layer)."""
        if self.keeps_base:
            d = self.mix.in_features
            self.mix.weight.copy_(torch.eye(d).repeat(self.e, 1))  # [(e, d), d]
        else:
            self.proj.weight.copy_(base.weight.repeat(self.e, 1))  # [(e, v), d]
            self.proj.bias.copy_(base.bias.repeat(self.e))
        _add_noise(self._main().weight, noise, generator)

    def grown_sources(self, rank: int) -> torch.Tensor:
        """For each of this head's E outputs, the output of a head of rank ``rank`` (a divisor) it copies when
        the head is grown from that one (``init_from_smaller``). -> [E] int64."""
        raise NotImplementedError

    @torch.no_grad()
    def init_from_smaller(self, small: "ComponentHead", noise: float, generator: torch.Generator | None = None) -> None:
        """This head as copies of a head of smaller rank r (a divisor m = R / r of this rank R, same kind and width):
        each output and each row of the ``aux`` heads copies the one ``grown_sources`` names, so the joint is the
        smaller head's exactly (each of its hidden states or components split into m equal copies: for TT the
        cores kron(G, J / m), J the m x m ones, which lump back to G; for CP r components each split into m of
        weight w / m). ``noise`` (relative std, as ``init_from_base``) then breaks the symmetry between copies."""
        if self.kind != small.kind or self.rank % small.rank:
            raise ValueError(f"a {self.kind} head of rank {self.rank} grows from a {self.kind} head of a rank "
                             f"dividing {self.rank}, got a {small.kind} head of rank {small.rank}")
        src = self.grown_sources(small.rank).to(self._main().weight.device)
        new, old = self._main(), small._main()  # [(e, width), d]: W' (width v) or W~ (width d, no bias)
        width = new.out_features // self.e
        new.weight.copy_(old.weight.view(small.e, width, -1)[src].reshape(new.weight.shape))
        if new.bias is not None:
            new.bias.copy_(old.bias.view(small.e, width)[src].reshape(-1))
        for name in self.aux:
            new, old = getattr(self, name), getattr(small, name)
            new.weight.copy_(old.weight[src])
            new.bias.copy_(old.bias[src])
        _add_noise(self._main().weight, noise, generator)

    def _main(self) -> nn.Linear:
        """The first matmul: W~ (its outputs then go through W) or W' (the outputs themselves)."""
        return self.mix if self.keeps_base else self.proj

    def _finish(self, z: torch.Tensor) -> torch.Tensor:
        """The first matmul's outputs [..., width] as logits [..., v]: through the frozen W, or as they are."""
        return self.base(z) if self.keeps_base else z

    def select_logits(self, h, start, count):
        """Sampling needs one CP component (count 1) or one TT core row j (e = j*r .. j*r + r - 1) per
        position, a factor r less head work than all E outputs. When the first matmul is small (E * v
        outputs of W', or E * d of W~, at most ``gather_max_outputs``) it runs over all E outputs and
        the rows' slices are gathered: a few large ops instead of one small matmul per distinct start.
        Otherwise rows sharing a start share one matmul on that slice of the weight."""
        if self.gathers_all(h):
            return self._all_then_gather(h, start[:, None] + torch.arange(count, device=h.device))
        return self._slices(h, start, count)

    def gather_logits(self, h, outputs):
        """When one pass over all E outputs is small (``gather_max_outputs``) or selects at least an eighth of
        them, it runs once and the rows' outputs are gathered; otherwise each row's outputs run as rows of
        their own, one matmul per distinct output (``_grouped``)."""
        n, c = outputs.shape
        if self.gathers_all(h) or 8 * c >= self.e:
            return self._all_then_gather(h, outputs)
        return self._slices(h.repeat_interleave(c, 0), outputs.flatten(), 1).view(n, c, -1)

    def gathers_all(self, h: torch.Tensor) -> bool:
        """Whether one pass over all E outputs is small (``gather_max_outputs`` outputs of the first matmul a row):
        then ``select_logits`` runs it and gathers the rows' slices."""
        return self.e * self._width(h) <= self.gather_max_outputs

    def component_logits(self, h):
        m = h.shape[0]  # may be 0: explicit widths, not -1
        return self._finish(self._main()(h).view(m, self.e, self._width(h)))

    def _width(self, h: torch.Tensor) -> int:
        """Columns of the first matmul per output: v (W') or d (W~)."""
        return self._main().out_features // self.e

    def _all_then_gather(self, h: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        """The first matmul over all E outputs, then each row's ``outputs`` [n, c] gathered -> [n, c, v]."""
        n, width = h.shape[0], self._width(h)
        rows = torch.arange(n, device=h.device)[:, None]
        return self._finish(self._main()(h).view(n, self.e, width)[rows, outputs])

    def _slices(self, h: torch.Tensor, start: torch.Tensor, count: int) -> torch.Tensor:
        """Outputs [start, start + count) of each row, one matmul per distinct start -> [n, count, v]."""
        main = self._main()
        return self._finish(self._grouped(h, start, count, main.weight, main.bias, self._width(h)))

    @staticmethod
    def _grouped(h, start, count, weight, bias, width) -> torch.Tensor:
        """One matmul per distinct start on rows [start * width, (start + count) * width) of ``weight``."""
        out = None
        for s0 in start.unique().tolist():
            sel = (start == s0).nonzero().flatten()
            w = weight[s0 * width:(s0 + count) * width]
            b = None if bias is None else bias[s0 * width:(s0 + count) * width]
            y = torch.nn.functional.linear(h[sel], w, b).view(len(sel), count, width)
            if out is None:
                out = y.new_empty((h.shape[0],) + y.shape[1:])
            out[sel] = y
        return out


def _add_noise(w: torch.Tensor, noise: float, generator: torch.Generator | None) -> None:
    """w += noise * std(w) * N(0, 1): breaks the symmetry between a head's copies (``noise`` a relative std)."""
    if noise > 0:
        w.add_(noise * w.std() * torch.randn(w.shape, generator=generator).to(w))


def zero_linear(in_features: int, out_features: int) -> nn.Linear:
    """A zero-initialized extra head (CP's weights, TT's contracted cores): uniform at the start."""
    layer = nn.Linear(in_features, out_features)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer
