"""A block diffusion model's key-value cache: a denoising step of block B computes B's b positions (and, once a
block, the block committed before it), not the sequence up to B.

Block-causal attention (``ttcore.models.block_attention``) makes a committed block's keys and values in every
layer a function of the blocks up to it, which never change once committed. So a run keeps them in a
``KVCache`` whose buffers hold every position (and one more, where pads are written): ``filled`` [b] says how
many positions, whole blocks, hold committed keys. A step runs the positions from ``filled`` to the end of the
current block in one call (``DiT.decode``): the committed blocks not yet cached (the prompt's at the first step,
the block finished by the step before at the first step of every later block) with the current block's noisy
tokens after them, each attending to the blocks up to its own. The committed ones' keys stay; the noisy block's
are written too, but no later step reads them (a step of the same block writes its own over them first, one of
the next block reads them after it wrote the clean block's). The features are those of the full forward
(``JointModel.features``) up to float rounding (tested in float64): a step costs b positions' forward (2b at a
block's first step) plus attention over the cache, instead of the prefix's forward."""

import torch

from .kv_cache import KVCache


def empty_cache(model, rows: int, device) -> KVCache:
    """No block committed yet: zero buffers of every layer's keys and values, [rows, h, l + 1, hd] each (position l:
    where pads are written), in the dtype the model's attention computes in (bf16 under autocast)."""
    dit = model.backbone
    c = dit.conditioning(1, None, None, device)
    d, h, l = dit.cfg.hidden_dim, dit.cfg.n_heads, dit.cfg.length
    dtype = dit.blocks[0].attn_qkv.weight.dtype
    if torch.is_autocast_enabled(torch.device(device).type):
        dtype = torch.get_autocast_dtype(torch.device(device).type)
    layers = [(torch.zeros(rows, h, l + 1, d // h, device=device, dtype=dtype),
               torch.zeros(rows, h, l + 1, d // h, device=device, dtype=dtype)) for _ in dit.blocks]
    return KVCache(layers, torch.zeros(rows, dtype=torch.long, device=device), c,
                   [block.modulations(c) for block in dit.blocks])


def block_step_features(model, cache: KVCache, x: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """The features [b, l, d] a step of block diffusion reads: x [b, l] the rows' tokens, whose current block ends
    at ``end`` [b] (a multiple of the block size) and is the only one holding a [MASK] before it; ``cache`` holds
    each row's committed positions below its ``filled``. Runs positions ``filled`` .. ``end`` - 1 of every row in
    one call (rows with fewer padded to the trash position l), sets ``filled`` to the current block's start, and
    returns the current block's features (zero at every other position); the committed positions run for their
    keys and values only (the last layer skips their queries and MLP)."""
    b, l = x.shape
    size = model.cfg.dit.block_size
    start = end - size
    behind = ((cache.filled > start) | (cache.filled % size != 0)).any()
    bad, n = torch.stack([behind.long(), (end - cache.filled).max()]).tolist()  # one wait for both
    if bad:
        raise ValueError("a block cache holds whole committed blocks before the current one")
    pos = cache.filled[:, None] + torch.arange(n, device=x.device)[None]  # [b, n]
    pos = torch.where(pos < end[:, None], pos, l)
    block = torch.arange(size, device=x.device)[None]
    keep = (start - cache.filled)[:, None] + block  # [b, size]: the current block's place among the n
    y = model.backbone.decode(model.backbone.read(x, pos), pos, cache.layers, cache.mods, keep)
    f = model.output_layer.features(y, cache.c)  # [b, size, d]
    h = f.new_zeros(b, l, f.shape[-1])
    h.scatter_(1, (start[:, None] + block)[..., None].expand_as(f), f)
    cache.filled = start
    return h


def current_block_end(masked: torch.Tensor, size: int, filled: torch.Tensor) -> torch.Tensor:
    """[b]: where each row's current block ends, the first block holding a [MASK] of ``masked`` [b, l] (a block
    model's rows: those before it committed, those after it wholly masked); a finished row's is the block at
    ``filled`` [b] (what its cache holds up to), which the step computes again and commits nothing to."""
    held = masked.view(masked.shape[0], -1, size).any(2)  # [b, blocks]
    return torch.where(held.any(1), (held.long().argmax(1) + 1) * size, filled + size)


def cached_block_features(model, caches: list[KVCache | None], sizes: list[int], x: torch.Tensor
                          ) -> tuple[torch.Tensor, list[KVCache]]:
    """The features a step of several block diffusion runs reads, in one backbone call: x [B, l] their rows in
    order, ``sizes`` each run's count, ``caches`` each run's cache (None: a new one); each row's current block is
    its own (``current_block_end``: rows of one run may be at different blocks, as EB's are).
    -> (features [B, l, d], each run's cache after the step)."""
    caches = [c if c is not None else empty_cache(model, n, x.device) for c, n in zip(caches, sizes)]
    cache = KVCache.cat(caches)
    dit = model.cfg.dit
    h = block_step_features(model, cache, x, current_block_end(x == dit.mask_id, dit.block_size, cache.filled))
    return h, cache.split(sizes)
