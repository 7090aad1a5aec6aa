"""Generation and exact likelihood of a block diffusion model (``ttcore.kinds.block_diffusion``): autoregressive
over blocks of b tokens, masked diffusion inside each, the format's joint over a block's masked positions.

Generation is the batched loop's ``sampler: blocks`` (``ttcore.sampling.steps.block``): block B in k steps
given the committed blocks before it, each step drawing the next positions of the run's predetermined order
inside the block jointly from the format's p(x_T | x_t^B, x_{<B}) with the rest of the block summed out, the
counts an even split of the block's masked positions over the k steps (``block_counts``), over the key-value
cache of the committed blocks (``ttcore.models.block_cache``). At k = 1 a block is one exact joint draw of all b
positions, so the law the sampler draws from is the model's own block chain, whose likelihood ``block_log_prob``
computes exactly: log p(x) = sum_B log p(x_B | x_{<B}), every block's joint given the clean blocks before it, in
one forward pass (``block_attention.training_features`` with every x_t token masked). At b steps a block left to
right (one token a step, each the first masked position of its block) the law is the chain of the joint's exact
marginals, and ``block_chain_log_prob`` computes its likelihood exactly too, in b passes."""

import torch

from ttcore.models.block_attention import split_blocks, training_features


def block_counts(size: int, steps: int) -> list[int]:
    """Tokens each of ``steps`` steps unmasks in a block of ``size`` positions: an even split (the first
    ``size % steps`` steps one more), every position by the last step."""
    steps = min(steps, size)
    return [size // steps + (j < size % steps) for j in range(steps)]


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
    the law of ``sampler: blocks`` at one step a block and temperature 1 given the known positions as a prompt."""
    size = model.cfg.dit.block_size
    if not bool(scorable(mask, size).all()):
        raise ValueError("a block diffusion model scores whole blocks after the first scored one: no known token "
                         "may follow the block of the first scored position")
    out, token = _masked_blocks(model, x0, mask)
    return out.log_prob(split_blocks(x0, size)).double().view(x0.shape[0], -1).sum(1), token


def _masked_blocks(model, x0: torch.Tensor, mask: torch.Tensor) -> tuple:
    """Every block's joint head outputs over its positions ``mask`` [b, l] given its other positions and the clean
    blocks before it (one pass over [x_t, x_0]), and each masked position's exact log-marginal [b, l] (float64,
    NaN where not masked)."""
    size = model.cfg.dit.block_size
    h = training_features(model, torch.where(mask, torch.full_like(x0, model.cfg.dit.mask_id), x0), x0)
    out = model.head_outputs(split_blocks(h, size), split_blocks(mask, size))
    token = torch.full(x0.shape, float("nan"), dtype=torch.float64, device=x0.device)
    token[mask] = out.marginal_log_probs(split_blocks(x0, size)).double()
    return out, token


def block_log_prob(model, x0: torch.Tensor) -> torch.Tensor:
    """log p(x0) [b] (float64) under a block diffusion model: sum over blocks of the joint head's exact
    log p(x0_B | x0_{<B}) (every position of the block masked), all blocks in one pass (``block_score`` with every
    position scored). Exact with respect to the model's per-block joints, so it is the likelihood of
    ``sampler: blocks`` at one step per block and temperature 1 (and, for TT, ``contraction`` irrelevant: every
    position of the block is drawn)."""
    return block_score(model, x0, torch.ones_like(x0, dtype=torch.bool))[0]


def block_chain_log_prob(model, x0: torch.Tensor) -> torch.Tensor:
    """log p(x0) [b] (float64) under ``sampler: blocks`` at b steps a block in left-to-right order and temperature
    1: sum over blocks B and offsets i of log p(x0_{B,i} | x0_{B,<i}, x0_{<B}), the joint's exact marginal at the
    first masked position of a block whose earlier positions are known (the masked ones after it sum out to 1 in
    every format, so the head's contraction does not enter). b passes, one per offset i, every block at once."""
    size, (b, l) = model.cfg.dit.block_size, x0.shape
    offset = torch.arange(l, device=x0.device) % size
    total = torch.zeros(b, dtype=torch.float64, device=x0.device)
    for i in range(size):
        total += _masked_blocks(model, x0, (offset >= i).expand(b, l))[1][:, offset == i].sum(1)
    return total
