"""Generation and exact likelihood of a block diffusion model (``ttcore.kinds.block_diffusion``): autoregressive
over blocks of b tokens, masked diffusion inside each, the format's joint over a block's masked positions.

``generate_blocks`` denoises block B in k steps (``steps_per_block``) given the committed blocks before it: each
step draws the next positions of a random order of the block (drawn once per block from the sequence's
streams), jointly from the format's p(x_T | x_t^B, x_{<B}) with the rest of the block summed out, the counts
an even split of b over the k steps. At k = 1 a block is one exact joint draw of all b positions, so the law the
sampler draws from is the model's own block chain, whose likelihood ``block_log_prob`` computes exactly:
log p(x) = sum_B log p(x_B | x_{<B}), every block's joint given the clean blocks before it, in one forward pass
(``block_attention.training_features`` with every x_t token masked).

The uniforms are counter-based (``Streams``: a sequence's tokens depend on its seed and row, not on its batch);
the step counter of block B's j-th step is B k + j. A step runs the block's b positions alone, over the key-value
cache of the committed blocks (``ttcore.models.block_cache``), and a committed block runs once more to join it."""

import torch

from ttcore.distributions import Site, Streams
from ttcore.models.block_attention import split_blocks, training_features
from ttcore.models.block_cache import BlockCache, block_features, commit


def block_counts(size: int, steps: int) -> list[int]:
    """Tokens each of ``steps`` steps unmasks in a block of ``size`` positions: an even split (the first
    ``size % steps`` steps one more), every position by the last step."""
    steps = min(steps, size)
    return [size // steps + (j < size % steps) for j in range(steps)]


@torch.no_grad()
def generate_blocks(model, num_samples: int, steps_per_block: int = 1, seed: int = 0, temperature: float = 1.0,
                    contraction: str = "head", device=None, prompt: torch.Tensor | None = None) -> torch.Tensor:
    """``num_samples`` sequences [n, l] from a block diffusion ``model``, block by block (module docstring).
    ``prompt`` [l]: known tokens, the mask id elsewhere, none after the block of its first [MASK] (``scorable``):
    the blocks it gives are prefilled into the cache in one pass, and the first block it leaves masked is drawn
    given its known positions (its masked ones split over the k steps)."""
    cfg = model.cfg.dit
    size, l, mask_id = cfg.block_size, cfg.length, cfg.mask_id
    if not size:
        raise ValueError("generate_blocks takes a block diffusion model (dit.block_size > 0)")
    device = device or next(model.parameters()).device
    tokens = torch.full((num_samples, l), mask_id, dtype=torch.long, device=device)
    if prompt is not None:
        tokens[:] = prompt.to(device)
        if not bool(scorable(tokens[:1] == mask_id, size).all()):
            raise ValueError("a block diffusion model takes no known token after the block of the prompt's first "
                             "[MASK]")
    k = len(block_counts(size, steps_per_block))
    masked = (tokens[0] == mask_id).view(-1, size).any(1)
    first = int(masked.float().argmax()) if bool(masked.any()) else l // size  # the first block to draw
    cache = BlockCache.empty(model, num_samples, device)
    if first:  # the prompt's whole blocks, prefilled in one pass
        cache = commit(model, cache, tokens[:, :first * size])
    for block in range(first, l // size):
        at = slice(block * size, (block + 1) * size)
        order = Streams.of_request(seed, num_samples, block, device).uniform(Site.plan, size)  # [n, b] priorities
        order = order.masked_fill(tokens[:, at] != mask_id, float("inf"))  # known positions last: never chosen
        rank = order.argsort(1).argsort(1)  # each masked position's place in the block's random order
        counts = block_counts(int((tokens[0, at] == mask_id).sum()), k)  # the block's masked over its k steps
        done = 0
        for j, count in enumerate(counts):
            chosen = (rank >= done) & (rank < done + count)
            done += count
            x = tokens[:, at]
            masked = x == mask_id
            h = block_features(model, cache, x)  # this block given the committed ones (the cache)
            streams = Streams.of_request(seed, num_samples, block * k + j, device)
            values = model.format.draw(model.head, h, x, masked, chosen, temperature, streams, contraction)
            tokens[:, at] = torch.where(chosen, values, x)
        cache = commit(model, cache, tokens[:, at])
    return tokens


def scorable(mask: torch.Tensor, size: int) -> torch.Tensor:
    """[b] bool: whether positions ``mask`` [b, l] can be scored exactly given the rest (``block_score``): every
    block after the first one holding a scored position is scored whole (no known token after that block).
    Inside the first scored block any positions may be known."""
    blocks = mask.view(mask.shape[0], -1, size)
    started = blocks.any(2).long().cummax(1).values.bool()  # [b, n]: at or after the first scored block
    later = torch.cat([torch.zeros_like(started[:, :1]), started[:, :-1]], 1)  # after it
    return ~(later & ~blocks.all(2)).any(1)


def block_score(model, x0: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(x0_M | the rest) [b] (float64) and each scored position's log p(x^i | its block's known positions,
    the blocks before) [b, l] (NaN where not scored), for ``mask`` [b, l] that ``scorable`` accepts: the first
    scored block B's joint p(x_B^M | x_B^known, x_{<B}) times p(x_C | x_{<C}) of every block C after it, all
    blocks in one pass (every block's x_t is x0 with its scored positions masked, given the clean blocks of x0
    before it). Exact with respect to the model's per-block joints, so it is the log-likelihood of
    ``generate_blocks``'s law at one step a block and temperature 1 given the known positions as a prompt."""
    size = model.cfg.dit.block_size
    if not bool(scorable(mask, size).all()):
        raise ValueError("a block diffusion model scores whole blocks after the first scored one: no known token "
                         "may follow the block of the first scored position")
    x_t = torch.where(mask, torch.full_like(x0, model.cfg.dit.mask_id), x0)
    h = training_features(model, x_t, x0)
    out = model.head_outputs(split_blocks(h, size), split_blocks(mask, size))
    token = torch.full(x0.shape, float("nan"), dtype=torch.float64, device=x0.device)
    token[mask] = out.marginal_log_probs(split_blocks(x0, size)).double()
    return out.log_prob(split_blocks(x0, size)).double().view(x0.shape[0], -1).sum(1), token


def block_log_prob(model, x0: torch.Tensor) -> torch.Tensor:
    """log p(x0) [b] (float64) under a block diffusion model: sum over blocks of the joint head's exact
    log p(x0_B | x0_{<B}) (every position of the block masked), all blocks in one pass (``block_score`` with every
    position scored). Exact with respect to the model's per-block joints, so it is the likelihood of
    ``generate_blocks`` at one step per block and temperature 1 (and, for TT, ``contraction`` irrelevant: every
    position of the block is drawn)."""
    return block_score(model, x0, torch.ones_like(x0, dtype=torch.bool))[0]
