"""A block diffusion model's key-value cache: a denoising step of block B computes B's b positions, not the
whole sequence.

Block-causal attention (``ttcore.models.block_attention``) makes a committed block's keys and values in every
layer a function of the blocks up to it, which never change once committed. So generation keeps them
(``BlockCache``): each step of block B runs B's tokens alone, attending to the cache and to each other
(``DiT.extend``), and once B is committed its clean tokens run once more to append their keys and values
(``commit``). The features are those of the full forward (``JointModel.features``) up to float rounding (tested
in float64): a step costs b positions' forward plus attention over the cache instead of l positions'."""

from dataclasses import dataclass

import torch


@dataclass
class BlockCache:
    """Every layer's keys and values of the committed blocks of b sequences, [(keys, values)] each [b, h, m, hd]
    with m the committed positions; ``c`` the model's conditioning [1, cond_dim] and ``mods`` every layer's
    adaLN modulations of it (no time, no latent: the same for every sequence and step), computed once."""
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    c: torch.Tensor
    mods: list

    @property
    def length(self) -> int:
        """The positions it holds (the committed blocks')."""
        return self.layers[0][0].shape[2]

    @classmethod
    def empty(cls, model, rows: int, device) -> "BlockCache":
        """No block committed yet."""
        dit = model.backbone
        c = dit.conditioning(1, None, None, device)
        d, h = dit.cfg.hidden_dim, dit.cfg.n_heads
        none = torch.zeros(rows, h, 0, d // h, device=device, dtype=next(model.parameters()).dtype)
        return cls([(none, none) for _ in dit.blocks], c, [block.modulations(c) for block in dit.blocks])


def block_features(model, cache: BlockCache, tokens: torch.Tensor) -> torch.Tensor:
    """The features [b, n, d] of the block after the cache's, tokens [b, n] (noisy: nothing is kept)."""
    y, _ = model.backbone.extend(tokens, cache.length, cache.layers, cache.mods)
    return model.output_layer.features(y, cache.c)


def commit(model, cache: BlockCache, tokens: torch.Tensor) -> BlockCache:
    """The cache with the clean block ``tokens`` [b, n] (the block after it) appended."""
    _, kv = model.backbone.extend(tokens, cache.length, cache.layers, cache.mods)
    layers = [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(cache.layers, kv)]
    return BlockCache(layers, cache.c, cache.mods)
