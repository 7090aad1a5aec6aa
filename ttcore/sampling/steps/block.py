"""Block diffusion's step (``sampler: blocks``) for the batched loop (``GenerationRun``, ``batch_step``): a block
diffusion model's run of K = k x (blocks) steps denoises block B in steps kB .. kB + k - 1, each drawing the
next positions of the run's predetermined order inside the block jointly from the format's joint over the
block's masked positions given the blocks before it (``ttcore.kinds.block_diffusion``); k = 1 is one exact joint
draw a block, whose law is ``ttcore.sampling.blocks.block_log_prob``'s. The backbone call is the kind's, over the
run's key-value cache of the committed blocks (``ttcore.models.block_cache``: the current block's positions
alone), or without a cache the loop's forward of the prefix up to the current block (``prefix_needed``:
block-causal, the current block's features read only the committed blocks); either way the step reads only the
block's slice."""

import torch

from ttcore.errors import InvalidSampler

from ..blocks import block_counts, scorable
from ..constrained import block_automaton, constrained_step
from ..joint_step import marginal_step
from ..orderings import PREDETERMINED, top_k_mask
from .base import ConfiguredStep


def check_block_run(config, steps: int, tokens: torch.Tensor, mask_id: int, size: int) -> None:
    """Refuse (``InvalidSampler`` naming the field) what a block diffusion run of ``sampler: blocks`` cannot be
    (another sampler is the kind's refusal, ``BlockDiffusion.check_run``): an adaptive ordering, a schedule or
    Bernoulli coins (a block's masked positions are split evenly over its k steps: no schedule applies), a step
    count that is not k steps for each block (1 <= k <= b), a prompt with a known token after the block of its
    first [MASK] (a block reads only the blocks before it: a later known token could not condition it)."""
    blocks = tokens.shape[1] // size
    if config.ordering not in PREDETERMINED:
        raise InvalidSampler("ordering", f"sampler blocks takes a predetermined ordering ({', '.join(PREDETERMINED)})"
                                         f", got {config.ordering!r}")
    default = type(config).__dataclass_fields__["schedule"].default
    if config.schedule != default or config.bernoulli:
        field = "bernoulli" if config.bernoulli else "schedule"
        raise InvalidSampler(field, "sampler blocks splits each block's masked positions evenly over its k steps: "
                                    "it takes no schedule and no Bernoulli coins")
    if steps % blocks or not 1 <= steps // blocks <= size:
        raise InvalidSampler("steps", f"a block diffusion model of {blocks} blocks of {size} tokens takes k steps "
                                      f"a block: steps = {blocks} k with 1 <= k <= {size}, got {steps}")
    if not bool(scorable(tokens == mask_id, size).all()):
        raise InvalidSampler("prompt", f"a block diffusion model conditions on the blocks before the one it draws: "
                                       f"no known token may follow the block of {size} tokens holding the first "
                                       f"[MASK] (known tokens inside that block are fine)")


class BlockStep(ConfiguredStep):
    """By name only (a block diffusion model's runs must use it): the current block's next positions by the run's
    order, drawn jointly over the block alone; for constrained rows from the block's joint restricted to the block
    completions some accepted sequence continues (``constrained.block_automaton``: the automaton started where the
    committed tokens left it). ``joint: false`` draws each of them from its exact marginal instead (the rank-1 view
    of the block's joint, ``joint_step.marginal_step``), unconstrained only (the kind refuses a constraint with it).
    A row with a stop token ends at the block that completes holding it (``stop_after``)."""

    constrains = True

    def plan(self, run):
        size = run.model.cfg.dit.block_size
        if not size:
            raise InvalidSampler("sampler", "sampler blocks takes a block diffusion model (dit.block_size > 0)")
        check_block_run(self.config, run.steps, run.tokens, run.mask_id, size)
        return super().plan(run)

    def _where(self, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row's current block's positions [b, bs], its step within the block [b] and its k [b]."""
        size = rows.model.cfg.dit.block_size
        k = rows.steps // (rows.length // size)
        at = (rows.step // k)[:, None] * size + torch.arange(size, device=k.device)[None]
        return at, rows.step % k, k

    def counts(self, rows, n_current):
        """The even split of the block's masked positions over its k steps, the first steps one more
        (``ttcore.sampling.blocks.block_counts`` for a whole block): the masked left over the steps left, rounded
        up. The blocks after the current one are wholly masked (``check_block_run``), so its masked positions are
        the row's, less theirs."""
        at, j, k = self._where(rows)
        after = rows.length - (at[:, -1] + 1)  # positions after the current block, all masked
        left = (n_current - after).clamp_min(0)
        return -(-left // (k - j))  # ceil

    def prefix_needed(self, run) -> int:
        """Up to the current block's end: block-causal attention makes a block's features independent of the
        blocks after it, so the batched loop's forward runs the prefix alone without a cache (the committed
        blocks again each step), and the cache runs what it does not hold of it (``block_step_features``)."""
        size = run.model.cfg.dit.block_size
        k = run.steps // (run.tokens.shape[1] // size)
        return (run.step_index // k + 1) * size

    def active_steps(self, run) -> list[int]:
        """The steps of the blocks from the first holding a masked position on, less those of its steps that
        unmask nothing (fewer masked positions than k): a block the prompt gives runs no step."""
        size = run.model.cfg.dit.block_size
        blocks = run.tokens.shape[1] // size
        k, n = run.steps // blocks, int(run.n_initial.max())
        if n == 0:
            return []
        todo = -(-n // size)  # blocks holding a masked position: the last ``todo``
        first, partial = blocks - todo, n - size * (todo - 1)  # the first one's masked positions
        return [first * k + j for j, count in enumerate(block_counts(partial, k)) if count] + \
            list(range((first + 1) * k, run.steps))

    def choose(self, rows, h, tokens, masked, counts):
        at, _, _ = self._where(rows)
        inside = torch.zeros_like(masked).scatter_(1, at, True)
        return top_k_mask(rows.plan, masked & inside, counts)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        at, _, _ = self._where(rows)
        hb = h.gather(1, at[..., None].expand(-1, -1, h.shape[-1]))
        xb, mb, cb = tokens.gather(1, at), masked.gather(1, at), chosen.gather(1, at)
        model = rows.model
        if rows.automaton is not None:
            automaton = block_automaton(rows.automaton, tokens, at[:, 0], at.shape[1])
            vb = constrained_step(model, hb, xb, mb, cb, rows.temperature, rows.streams, automaton)
        elif not self.config.joint:
            vb = marginal_step(model, hb, xb, mb, cb, None, None, rows.temperature, rows.streams,
                               self.config.contraction)
        else:
            vb = model.format.draw(model.head, hb, xb, mb, cb, rows.temperature, rows.streams,
                                   self.config.contraction)
        values = torch.full_like(tokens, -1).scatter_(1, at, torch.where(cb, vb, -1))
        return values if rows.stop is None else stop_after(values, at, torch.where(cb, vb, xb), mb & ~cb, rows.stop)


def stop_after(values: torch.Tensor, at: torch.Tensor, block: torch.Tensor, left: torch.Tensor,
               stop: torch.Tensor) -> torch.Tensor:
    """A step's ``values`` [b, l] (-1: not committed) with every position after the current block (``at`` [b, bs],
    wholly masked) set to the row's stop token when the step completes the block (``left`` [b, bs]: its positions
    still masked after the step, none) and ``block`` [b, bs], its tokens after the step, holds it (``stop`` [b]:
    each row's, -1 none): the sequence ends there."""
    hit = (stop >= 0) & ~left.any(1) & (block == stop[:, None]).any(1)
    after = torch.arange(values.shape[1], device=values.device)[None] > at[:, -1:]
    return torch.where(hit[:, None] & after, stop[:, None], values)
