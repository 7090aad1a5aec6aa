"""Bidirectional DiT backbone in MDLM's layout (Sahoo et al. 2024), with the paper's RoPE fix.

Parameter names follow MDLM's ``models/dit.py`` (vocab_embed, sigma_map, blocks.N.attn_qkv, ...), so
an MDLM checkpoint maps onto this module by name. adaLN modulation is always present, as in MDLM;
``time_conditioning = False`` (mdlm-owt's setting, our default) feeds sigma = 0.

App. C: with plain RoPE a fully masked input gives every position the same value vector, so the
attention output, and every logit, is identical across positions. ``rotary_values = True`` rotates
the values as well, which breaks that symmetry.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass
class DiTConfig:
    vocab_size: int  # input vocabulary, [MASK] included (v + 1)
    out_vocab: int  # predicted vocabulary (v): [MASK] is never predicted (SUBS)
    length: int
    hidden_dim: int = 256
    cond_dim: int = 128
    n_blocks: int = 6
    n_heads: int = 8
    mlp_ratio: int = 4
    dropout: float = 0.0
    time_conditioning: bool = False
    rotary_values: bool = True
    latent_dim: int = 0  # > 0: a VADD latent z (Sec. 4.4) enters the conditioning (adaLN) of every block
    causal: bool = False  # inputs shifted right (position i reads x^{i-1}): alone, the autoregressive model
    # (``ttcore.kinds.autoregressive``: causal attention); with block_size, a block model of next-token layout
    block_size: int = 0  # > 0: block diffusion (``ttcore.kinds.block_diffusion``): blocks of this many tokens

    def __post_init__(self):
        if self.block_size < 0 or (self.block_size and self.length % self.block_size):
            raise ValueError(f"block_size must be 0 (full-sequence) or divide the length {self.length}, got "
                             f"{self.block_size}")
        if self.time_conditioning:  # training, scoring and sampling would each feed the network another time
            raise ValueError("time_conditioning=True is not supported: ttcore's samplers and scores feed the "
                             "network no time (sigma = 0), as mdlm-owt's checkpoints expect; a checkpoint trained "
                             "on sigma(t) would get logits from the wrong time")

    @classmethod
    def for_tokenizer(cls, tokenizer, **arch) -> "DiTConfig":
        """The backbone for ``tokenizer``'s vocabulary (plus [MASK] in, without it out: SUBS) and length;
        ``arch``: the other fields."""
        return cls(vocab_size=tokenizer.vocab_size + 1, out_vocab=tokenizer.vocab_size, length=tokenizer.length,
                   **arch)

    @property
    def mask_id(self) -> int:
        """The [MASK] input id: the last of the input vocabulary (SUBS: never predicted)."""
        return self.vocab_size - 1


def rotary_tables(length: int, head_dim: int, base: float = 10_000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [l, head_dim] in the rotate-half layout (RoFormer, Su et al. 2024)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # [l, head_dim / 2]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [b, h, l, hd] by position: x R_m."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class LayerNorm(nn.Module):
    """LayerNorm without bias, computed in float32 (MDLM's)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.dim = dim

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            x = F.layer_norm(x.float(), [self.dim])
        return x * self.weight[None, None, :]


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding of sigma followed by an MLP (MDLM's sigma_map)."""

    def __init__(self, cond_dim: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:  # [b] -> [b, cond_dim]
        half = self.frequency_dim // 2
        freqs = torch.exp(-math.log(10_000) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half)
        args = sigma[:, None].float() * freqs[None]
        return self.mlp(torch.cat([args.cos(), args.sin()], -1).to(self.mlp[0].weight.dtype))


class EmbeddingLayer(nn.Module):
    def __init__(self, dim: int, vocab_size: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab_size, dim))
        nn.init.kaiming_uniform_(self.embedding, a=math.sqrt(5))

    def forward(self, x):
        return self.embedding[x]


class DDiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        d = cfg.hidden_dim
        self.n_heads, self.rotary_values, self.dropout = cfg.n_heads, cfg.rotary_values, cfg.dropout
        self.causal = cfg.causal
        self.norm1 = LayerNorm(d)
        self.attn_qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.norm2 = LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, cfg.mlp_ratio * d), nn.GELU(approximate="tanh"),
                                 nn.Linear(cfg.mlp_ratio * d, d))
        self.adaLN_modulation = nn.Linear(cfg.cond_dim, 6 * d)
        nn.init.zeros_(self.adaLN_modulation.weight)
        nn.init.zeros_(self.adaLN_modulation.bias)

    def _qkv(self, x, rotary, mods):
        """Queries, keys and values [b, h, n, hd] of x [b, n, d], rotated by ``rotary`` (cos, sin broadcastable
        to them: [n, hd] for positions 0..n-1, or [b, 1, 1, hd] for one position per sequence)."""
        b, n, d = x.shape
        h = modulate(self.norm1(x), mods[0], mods[1])
        qkv = self.attn_qkv(h).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [b, h, n, hd]
        cos, sin = (t.to(q.dtype) for t in rotary)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.rotary_values:  # App. C: positions must reach the values too
            v = apply_rotary(v, cos, sin)
        return q, k, v

    def _residuals(self, x, att, mods):
        """The attention output att [b, h, n, hd] and the MLP added to the residual stream x [b, n, d]."""
        b, n, d = x.shape
        att = att.transpose(1, 2).reshape(b, n, d)
        x = x + mods[2] * F.dropout(self.attn_out(att), self.dropout, self.training)  # as MDLM: dropout on the
        # residuals only
        h = modulate(self.norm2(x), mods[3], mods[4])
        return x + mods[5] * F.dropout(self.mlp(h), self.dropout, self.training)

    def forward(self, x, rotary, c, kv: list | None = None, attn_mask: torch.Tensor | None = None):
        """x [b, l, d] -> [b, l, d]. ``kv`` (a causal block): a list that receives this block's keys and values
        [b, h, l, hd] (``ttcore.models.kv_cache``). ``attn_mask`` [l, l] bool: which keys each query reads (a
        block diffusion model's, ``ttcore.models.block_attention``); None: all, or the earlier ones when causal."""
        mods = self.modulations(c)
        q, k, v = self._qkv(x, rotary, mods)
        if kv is not None:
            kv.append((k.contiguous(), v.contiguous()))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0,
                                             is_causal=self.causal and attn_mask is None)
        return self._residuals(x, att, mods)

    def modulations(self, c) -> tuple:
        """adaLN's shift, scale and gate of the attention and of the MLP from c [b, cond_dim]: six [b, 1, d]."""
        return self.adaLN_modulation(c)[:, None].chunk(6, dim=2)

    def decode(self, x, rotary, mods, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor,
               seen: torch.Tensor, keep: torch.Tensor | None = None):
        """New positions over a key-value cache: x [b, n, d] at positions ``pos`` [b, n], ``rotary`` their rows
        [b, 1, n, hd], ``mods`` its ``modulations``. Their keys and values are written into ``keys`` / ``values``
        [b, h, L, hd] at ``pos`` (holding the earlier positions' from before) and each attends to the keys
        ``seen`` [b, 1, n, L] (bool) gives it, as ``forward``'s causal or block-causal attention does there
        (``DiT.decode``). ``keep`` [b, m]: only these of the n run on past their keys and values (queries,
        attention, MLP). -> [b, n, d] ([b, m, d] with ``keep``)."""
        q, k, v = self._qkv(x, rotary, mods)
        at = pos[:, None, :, None].expand_as(k)
        keys.scatter_(2, at, k.to(keys.dtype))
        values.scatter_(2, at, v.to(values.dtype))
        if keep is not None:
            x = x.gather(1, keep[..., None].expand(-1, -1, x.shape[-1]))
            q = q.gather(2, keep[:, None, :, None].expand(-1, q.shape[1], -1, q.shape[-1]))
            seen = seen.gather(2, keep[:, None, :, None].expand(-1, -1, -1, seen.shape[-1]))
        att = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=seen)
        return self._residuals(x, att, mods)


class DiT(nn.Module):
    """x_t [b, l] -> final features [b, l, d] (``features``); the output layer lives in the heads.

    ``causal``: the input shifted one position right with [MASK] as the start token (position i reads x^{i-1},
    ``read``). Alone, the same blocks as an autoregressive model: attention only to earlier positions, so position
    i's features see x^{<i} only and its head predicts p(x^i | x^{<i}) (``ttcore.kinds.autoregressive``). With
    ``block_size``, block-causal attention over the shifted inputs (SDAR's next-token layout, a block model started
    from an autoregressive one): block B's positions read the last token before B and B's own tokens but its last;
    at b = 1 that is the autoregressive model exactly."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_embed = EmbeddingLayer(cfg.hidden_dim, cfg.vocab_size)
        self.sigma_map = TimestepEmbedder(cfg.cond_dim)
        # VADD: z's projection is added to the sigma embedding before the SiLU; zero-initialized, so a
        # latent model starts as the MDM it would be without z
        self.latent_map = nn.Linear(cfg.latent_dim, cfg.cond_dim) if cfg.latent_dim else None
        if self.latent_map is not None:
            nn.init.zeros_(self.latent_map.weight)
            nn.init.zeros_(self.latent_map.bias)
        self.blocks = nn.ModuleList(DDiTBlock(cfg) for _ in range(cfg.n_blocks))
        self.checkpointing = False  # training: recompute each block's activations in backward (``checkpointing_``)
        cos, sin = rotary_tables(cfg.length, cfg.hidden_dim // cfg.n_heads)
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)

    def conditioning(self, b: int, sigma: torch.Tensor | None, z: torch.Tensor | None, device) -> torch.Tensor:
        """The blocks' adaLN input c [b, cond_dim]: SiLU of sigma's embedding (sigma = 0 without time
        conditioning) plus, for a VADD model, z's projection."""
        if sigma is None or not self.cfg.time_conditioning:
            sigma = torch.zeros(b, device=device)
        c = self.sigma_map(sigma)
        if (z is None) != (self.latent_map is None):
            raise ValueError(f"z is needed exactly when latent_dim > 0 (latent_dim={self.cfg.latent_dim}, "
                             f"z {'missing' if z is None else 'given'})")
        if z is not None:
            c = c + self.latent_map(z.to(self.latent_map.weight.dtype))
        return F.silu(c)

    def read(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The tokens positions ``pos`` [b, n] read from sequences x [b, l]: x^{pos} or, ``causal``, x^{pos-1} (the
        start token [MASK] at position 0); a position past the end reads the last token (a pad's input)."""
        l = x.shape[1]
        if not self.cfg.causal:
            return x.gather(1, pos.clamp_max(l - 1))
        before = x.gather(1, (pos - 1).clamp(0, l - 1))
        return torch.where(pos > 0, before, torch.full_like(before, self.cfg.mask_id))

    def forward(self, x_t: torch.Tensor, sigma: torch.Tensor | None = None,
                z: torch.Tensor | None = None, kv: list | None = None, attn_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, shifted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (features [b, n, d], conditioning c [b, cond_dim]) of x_t [b, n]. ``z`` [b, latent_dim]: the VADD
        latent (required when ``latent_dim`` > 0, refused otherwise). ``kv`` (a causal model): a list that
        receives every block's keys and values (``ttcore.models.kv_cache``). ``attn_mask`` [n, n] bool and
        ``positions`` [n] (each token's position, for the rotary tables): a block diffusion model's training
        pass over [x_t, x_0] (``ttcore.models.block_attention``); by default positions 0..n-1 and, for a block diffusion
        model, its block-causal attention. ``shifted``: x_t is already what each position reads (a causal model's
        training pass over [x_t, x_0] shifts each half itself)."""
        b, n = x_t.shape
        c = self.conditioning(b, sigma, z, x_t.device)
        if self.cfg.causal and not shifted:  # position i reads x^{i-1}; position 0 the start token
            x_t = torch.cat([torch.full_like(x_t[:, :1], self.cfg.mask_id), x_t[:, :-1]], 1)
        if attn_mask is None and self.cfg.block_size:
            from .block_attention import block_causal_mask

            attn_mask = block_causal_mask(n, self.cfg.block_size, x_t.device)
        x = self.vocab_embed(x_t)  # [b, n, d]
        rotary = (self.rotary_cos[:n], self.rotary_sin[:n]) if positions is None else \
            (self.rotary_cos[positions], self.rotary_sin[positions])
        for block in self.blocks:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, rotary, c, None, attn_mask, use_reentrant=False)
            else:
                x = block(x, rotary, c, kv, attn_mask)
        return x, c

    def decode(self, inputs: torch.Tensor, pos: torch.Tensor, kv: list, mods: list,
               keep: torch.Tensor | None = None) -> torch.Tensor:
        """Features of new positions over a key-value cache (``ttcore.models.kv_cache``, ``block_cache``):
        ``inputs`` [b, n] the tokens that positions ``pos`` [b, n] read (a causal model's: x^{pos-1}, the start
        token at 0; a block diffusion model's: x^{pos}), ``kv`` every block's (keys, values) [b, h, L, hd], which
        hold the earlier positions' and receive these; a position >= ``length`` is a pad, written at it (L must
        exceed it) and read by none of the others. ``mods``: every block's ``modulations`` of the model's
        conditioning (no time, no latent: the same for every sequence and step; [1, 1, d] each). Each position
        attends to the positions before it (causal) or to the blocks up to its own (block-causal). ``keep`` [b, m]
        (indices into n): the positions whose features are wanted; the others are run for their keys and values
        only, so the last block skips their queries and MLP. -> [b, n, d] ([b, m, d] with ``keep``): what
        ``forward`` computes there, given the same earlier tokens."""
        x = self.vocab_embed(inputs)  # [b, n, d]
        at = pos.clamp_max(self.cfg.length - 1)
        rotary = (self.rotary_cos[at][:, None], self.rotary_sin[at][:, None])
        size = self.cfg.block_size or 1  # causal: blocks of one position
        key_blocks = torch.arange(kv[0][0].shape[2], device=pos.device) // size
        seen = (key_blocks[None, None] <= (pos // size)[:, :, None])[:, None]  # [b, 1, n, L]: every layer's
        last = len(self.blocks) - 1
        for i, (block, (keys, values), m) in enumerate(zip(self.blocks, kv, mods)):
            x = block.decode(x, rotary, m, keys, values, pos, seen, keep if i == last else None)
        return x

    def checkpointing_(self, on: bool = True) -> "DiT":
        """Activation checkpointing: in training, each block keeps only its input and recomputes the rest in
        backward (memory for about a third more compute); the gradients are the same."""
        self.checkpointing = on
        return self
