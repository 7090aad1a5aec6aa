"""The model's final layer (MDLM's): the adaLN-modulated norm whose features every format's head reads, and
the base head W. The formats' heads themselves live with their formats (``ttcore.decompositions.heads``)."""

import torch
from torch import nn

from .dit import LayerNorm, modulate


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
