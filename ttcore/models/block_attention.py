"""Block diffusion's attention (BD3-LM: Arriola et al., ICLR 2025, arXiv 2503.09573): the sequence is split into
blocks of b tokens; block B's tokens attend to each other and to the blocks before it, never to a later one, so
the model is autoregressive over blocks and a masked diffusion model inside one.

At generation the sequence holds the committed (clean) blocks before B and block B's noisy tokens; the
block-causal mask (``block_causal_mask``) makes block B's features a function of exactly those. In training
every block is noised at once, each given the clean blocks before it, in one pass over the 2l tokens
[x_t, x_0] (``training_mask``, as BD3-LM's vectorized training): x_t's block B reads x_t's block B and x_0's
blocks < B; x_0's block B reads x_0's blocks <= B (its keys are what generation's clean blocks give). Both
halves take positions 0..l-1 (``training_positions``), so x_t's block B sees the same keys as at generation."""

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


def training_features(model, x_t: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor | None = None) -> torch.Tensor:
    """The features of x_t [b, l] with every block given the clean blocks of x0 before it, in one pass over
    [x_t, x_0] -> [b, l, d]: block B's rows are what generation computes for block B noised as x_t after the
    clean blocks x0_{<B} (``tests/models/test_block_attention.py`` checks it block by block)."""
    b, l = x_t.shape
    size = model.cfg.dit.block_size
    x, c = model.backbone(torch.cat([x_t, x0], 1), sigma, attn_mask=training_mask(l, size, x_t.device),
                          positions=training_positions(l, x_t.device))
    return model.output_layer.features(x[:, :l], c)


def split_blocks(t: torch.Tensor, block_size: int) -> torch.Tensor:
    """[b, l, ...] -> [b * l / bs, bs, ...]: each block a sequence of its own (a format's joint over one block)."""
    b, l = t.shape[:2]
    return t.reshape(b * (l // block_size), block_size, *t.shape[2:])
