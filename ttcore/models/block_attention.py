"""Block diffusion's attention (BD3-LM: Arriola et al., ICLR 2025, arXiv 2503.09573): the sequence is split into
blocks of b tokens; block B's tokens attend to each other and to the blocks before it, never to a later one, so
the model is autoregressive over blocks and a masked diffusion model inside one.

At generation the sequence holds the committed (clean) blocks before B and block B's noisy tokens; the
block-causal mask (``block_causal_mask``) makes block B's features a function of exactly those. In training
every block is noised at once, each given the clean blocks before it, in one pass over the 2l tokens
[x_t, x_0] (``training_mask``, as BD3-LM's vectorized training): x_t's block B reads x_t's block B and x_0's
blocks < B; x_0's block B reads x_0's blocks <= B (its keys are what generation's clean blocks give). Both
halves take positions 0..l-1 (``training_positions``), so x_t's block B sees the same keys as at generation.

A model with shifted inputs (``DiTConfig.causal`` with a block size: position i reads x^{i-1}) reads at the first
position of each block the last token of the block before, clean at generation: x_t's half reads it from x_0
(``training_inputs``)."""

import torch


def block_ids(length: int, block_size: int, device=None) -> torch.Tensor:
    """Each position's block, i // b. -> [l] long."""
    return torch.arange(length, device=device) // block_size


def block_causal_mask(length: int, block_size: int, device=None) -> torch.Tensor:
    """[l, l] bool, query i reads key j iff block(j) <= block(i)."""
    ids = block_ids(length, block_size, device)
    return ids[None, :] <= ids[:, None]


def training_mask(length: int, block_size: int, device=None) -> torch.Tensor:
    """[2l, 2l] bool over [x_t, x_0] (module docstring): x_t's queries read x_t's own block and x_0's earlier
    blocks; x_0's queries read x_0's blocks up to their own, never x_t."""
    ids = block_ids(length, block_size, device)
    same = ids[None, :] == ids[:, None]
    earlier = ids[None, :] < ids[:, None]
    upto = ids[None, :] <= ids[:, None]
    top = torch.cat([same, earlier], 1)
    bottom = torch.cat([torch.zeros_like(same), upto], 1)
    return torch.cat([top, bottom], 0)


def training_positions(length: int, device=None) -> torch.Tensor:
    """Both halves of [x_t, x_0] at positions 0..l-1. -> [2l] long."""
    return torch.arange(length, device=device).repeat(2)


def training_inputs(cfg, x_t: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """What the 2l positions of [x_t, x_0] read -> [b, 2l]: the halves themselves, or for a model with shifted
    inputs (``cfg.causal``, a ``DiTConfig``) each half shifted right (the start token [MASK] at position 0), x_t's
    first position of every block reading x_0's token before it (the committed token generation reads there)."""
    if not cfg.causal:
        return torch.cat([x_t, x0], 1)
    start = torch.full_like(x0[:, :1], cfg.mask_id)
    clean = torch.cat([start, x0[:, :-1]], 1)
    first = torch.arange(x0.shape[1], device=x0.device) % cfg.block_size == 0
    noisy = torch.where(first, clean, torch.cat([start, x_t[:, :-1]], 1))
    return torch.cat([noisy, clean], 1)


def training_features(model, x_t: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor | None = None) -> torch.Tensor:
    """The features of x_t [b, l] with every block given the clean blocks of x0 before it, in one pass over
    [x_t, x_0] -> [b, l, d]: block B's rows are what generation computes for block B noised as x_t after the
    clean blocks x0_{<B} (``tests/models/test_block_attention.py`` checks it block by block)."""
    b, l = x_t.shape
    size = model.cfg.dit.block_size
    x, c = model.backbone(training_inputs(model.cfg.dit, x_t, x0), sigma, attn_mask=training_mask(l, size, x_t.device),
                          positions=training_positions(l, x_t.device), shifted=True)
    return model.output_layer.features(x[:, :l], c)


def split_blocks(t: torch.Tensor, block_size: int) -> torch.Tensor:
    """[b, l, ...] -> [b * l / bs, bs, ...]: each block a sequence of its own (a format's joint over one block)."""
    b, l = t.shape[:2]
    return t.reshape(b * (l // block_size), block_size, *t.shape[2:])
