"""Output heads (Sec. 4.5): the base MDM head and the heads that turn it into a CP / TT joint.

E outputs per position: E = r for CP (plus r weight logits per sequence), E = r*r for TT, laid out
as e = j * r + k. Heads run on masked positions only ([m, d] features).
- 1-layer: W' in H x (E*V) replaces the base W; initialized as E copies of W.
- 2-layer: W~ in H x (E*H) inserted before the frozen W, which is applied to each of the E outputs;
  initialized as E stacked identities.
Small Gaussian noise breaks the symmetry between the copies; with zero noise the joint model has the
base model's marginals and likelihood exactly.
"""

import torch
from torch import nn

from ttcore.decompositions import get_decomposition

from .dit import LayerNorm, modulate

GATHER_MAX_OUTPUTS = 8192  # select_logits: all E outputs then gather, up to this many outputs per row


class FinalLayer(nn.Module):
    """MDLM's DDitFinalLayer: adaLN-modulated norm, then the base head W (``linear``)."""

    def __init__(self, hidden_dim: int, cond_dim: int, out_vocab: int, with_linear: bool = True):
        super().__init__()
        self.norm_final = LayerNorm(hidden_dim)
        self.linear = nn.Linear(hidden_dim, out_vocab) if with_linear else None
        self.adaLN_modulation = nn.Linear(cond_dim, 2 * hidden_dim)
        nn.init.zeros_(self.adaLN_modulation.weight)
        nn.init.zeros_(self.adaLN_modulation.bias)
        if with_linear:
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)

    def features(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c)[:, None].chunk(2, dim=2)
        return modulate(self.norm_final(x), shift, scale)  # [b, l, d]


class JointHead(nn.Module):
    """E outputs per masked position, plus the decomposition's extra heads (CP: the mixture weights
    ``weights``; TT: the contracted-core head ``contracted``)."""

    HEADS = ("1layer", "2layer")

    def __init__(self, decomposition: str, rank: int, head: str, hidden_dim: int, out_vocab: int):
        super().__init__()
        spec = get_decomposition(decomposition)
        if not spec.joint_head:
            raise ValueError(f"decomposition {decomposition!r} (rank 1) has no joint head: it uses the base head W")
        if head not in self.HEADS:
            raise ValueError(f"head must be one of {', '.join(self.HEADS)}, got {head!r}")
        self.decomposition, self.rank, self.head = decomposition, rank, head
        self.e = spec.outputs_per_position(rank)
        self.gather_max_outputs = GATHER_MAX_OUTPUTS
        if head == "1layer":
            self.proj = nn.Linear(hidden_dim, self.e * out_vocab)  # W'
        else:
            self.mix = nn.Linear(hidden_dim, self.e * hidden_dim, bias=False)  # W~
        for name, module in spec.extra_heads(hidden_dim, rank).items():
            self.add_module(name, module)

    @torch.no_grad()
    def init_from_base(self, base: nn.Linear, noise: float, generator: torch.Generator | None = None) -> None:
        """Preserve the base marginals: E copies of W (1-layer) or E stacked identities (2-layer)."""
        if self.head == "1layer":
            self.proj.weight.copy_(base.weight.repeat(self.e, 1))  # [(e, v), d]
            self.proj.bias.copy_(base.bias.repeat(self.e))
            w = self.proj.weight
        else:
            d = self.mix.in_features
            self.mix.weight.copy_(torch.eye(d).repeat(self.e, 1))  # [(e, d), d]
            w = self.mix.weight
        if noise > 0:
            w.add_(noise * w.std() * torch.randn(w.shape, generator=generator).to(w))

    def select_logits(self, h: torch.Tensor, start: torch.Tensor, count: int, base: nn.Linear | None) -> torch.Tensor:
        """Only outputs e in [start, start + count) of each row: h [n, d], start [n] -> [n, count, v].

        Sampling needs one CP component (count 1) or one TT core row j (e = j*r .. j*r + r - 1) per
        position, a factor r less head work than all E outputs. When the first matmul is small (E * v
        outputs of W', or E * d of W~, at most ``gather_max_outputs``) it runs over all E outputs and
        the rows' slices are gathered: a few large ops instead of one small matmul per distinct start.
        Otherwise rows sharing a start share one matmul on that slice of the weight."""
        if self.e * self._width(h) <= self.gather_max_outputs:
            return self._all_then_gather(h, start[:, None] + torch.arange(count, device=h.device), base)
        return self._slices(h, start, count, base)

    def gather_logits(self, h: torch.Tensor, outputs: torch.Tensor, base: nn.Linear | None) -> torch.Tensor:
        """Any c outputs of each row: h [n, d], outputs [n, c] (indices into the E outputs) -> [n, c, v].

        When one pass over all E outputs is small (``gather_max_outputs``) or selects at least an eighth of
        them, it runs once and the rows' outputs are gathered; otherwise each row's outputs run as rows of
        their own, one matmul per distinct output (``_grouped``)."""
        n, c = outputs.shape
        if self.e * self._width(h) <= self.gather_max_outputs or 8 * c >= self.e:
            return self._all_then_gather(h, outputs, base)
        return self._slices(h.repeat_interleave(c, 0), outputs.flatten(), 1, base).view(n, c, -1)

    def _width(self, h: torch.Tensor) -> int:
        """Columns of the first matmul per output: v (W') or d (W~)."""
        return h.shape[1] if self.head == "2layer" else self.proj.out_features // self.e

    def _all_then_gather(self, h: torch.Tensor, outputs: torch.Tensor, base: nn.Linear | None) -> torch.Tensor:
        """The first matmul over all E outputs, then each row's ``outputs`` [n, c] gathered -> [n, c, v]."""
        n, width = h.shape[0], self._width(h)
        rows = torch.arange(n, device=h.device)[:, None]
        if self.head == "2layer":
            return base(self.mix(h).view(n, self.e, width)[rows, outputs])
        return self.proj(h).view(n, self.e, width)[rows, outputs]

    def _slices(self, h: torch.Tensor, start: torch.Tensor, count: int, base: nn.Linear | None) -> torch.Tensor:
        """Outputs [start, start + count) of each row, one matmul per distinct start -> [n, count, v]."""
        if self.head == "2layer":
            return base(self._grouped(h, start, count, self.mix.weight, None, self._width(h)))
        return self._grouped(h, start, count, self.proj.weight, self.proj.bias, self._width(h))

    def _grouped(self, h, start, count, weight, bias, width) -> torch.Tensor:
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

    def component_logits(self, h: torch.Tensor, base: nn.Linear | None) -> torch.Tensor:
        """h [m, d] -> [m, e, v]."""
        m = h.shape[0]  # may be 0: explicit widths, not -1
        if self.head == "1layer":
            return self.proj(h).view(m, self.e, self.proj.out_features // self.e)
        return base(self.mix(h).view(m, self.e, self.mix.in_features))  # the frozen W on each of the E outputs
