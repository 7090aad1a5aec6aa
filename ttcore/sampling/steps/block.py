"""Block diffusion's step (``sampler: blocks``) for the batched loop (``GenerationRun``, ``batch_step``): a block
diffusion model's run denoises one block at a time given the blocks before it (``ttcore.kinds.block_diffusion``),
each step drawing some of the block's masked positions jointly from the format's joint over the block's masked
positions. Which, and how many a step:
- k even steps a block (K = k x blocks, the default): the run's predetermined order inside the block, or an
  adaptive ordering's best by the exact marginals of the block joint the step draws from (a TT's other masked
  positions summed as ``contraction`` says; ``adaptive_path: fast``, then one joint draw of
  the chosen set) or by the exact chain rule (``exact``, re-ranking after each pick); k = 1 is one exact joint
  draw a block, whose law is ``ttcore.sampling.blocks.block_log_prob``'s, whatever the ordering.
- EB-Sampler inside the block (``block_eb_gamma``): a step takes the largest prefix of the block's masked
  positions ranked by ``eb_proxy`` whose entropies keep EB's bound, so a block takes as many steps as its
  tokens' uncertainty asks; K is then the most steps the run may take, and a block whose deadline comes (as many
  steps left as blocks holding a [MASK]) takes all it has left.
The backbone call is the kind's, over the run's key-value cache of the committed blocks
(``ttcore.models.block_cache``: the current block's positions alone), or without a cache the loop's forward of
the prefix up to the current block (``prefix_needed``: block-causal, the current block's features read only the
committed blocks); either way the step reads only the block's slice."""

from dataclasses import dataclass

import torch

from ttcore.errors import InvalidSampler
from ttcore.models.block_cache import current_block_end

from ..blocks import block_counts, scorable
from ..constrained import block_automaton, constrained_step
from ..eb import eb_score
from ..joint_step import marginal_step
from ..orderings import ADAPTIVE, top_k_mask
from .base import ConfiguredStep
from .chain_rule import chain_rule_step
from .fast_adaptive import choice_by_marginals, constrained_marginals
from .settings import StepSettings, setting


@dataclass(frozen=True)
class BlockSettings(StepSettings):
    """The block step's own setting: EB-Sampler inside each block."""
    block_eb_gamma: float | None = setting(
        None, "`sampler: blocks`: EB-Sampler inside each block (Ben-Hamu et al. 2025). Each step unmasks the "
              "current block's masked positions ranked by `eb_proxy`, the largest prefix whose entropies satisfy "
              "sum H - max H <= this budget (at least one), so a block takes as many steps as its tokens' "
              "uncertainty asks (0: one token a step). `steps` is then the most steps the run may take, at least "
              "the model's blocks; a block whose deadline comes takes all it has left. Unset: `steps` / blocks even "
              "steps a block.", ge=0, le=1e6)

    def check(self, config) -> None:
        if self.block_eb_gamma is not None and config.sampler != "blocks":
            raise InvalidSampler("block_eb_gamma", "block_eb_gamma applies to sampler blocks (a block diffusion "
                                                   "model's), not to the sampler these settings select")


def check_block_run(config, steps: int, tokens: torch.Tensor, mask_id: int, size: int) -> None:
    """Refuse (``InvalidSampler`` naming the field) what a block diffusion run of ``sampler: blocks`` cannot be
    (another sampler is the kind's refusal, ``BlockDiffusion.check_run``): a schedule or Bernoulli coins (a
    block's masked positions are split evenly over its k steps, or by EB's bound: no schedule applies), a step
    count that is not k steps for each block (1 <= k <= b) or, with EB, fewer steps than blocks, a prompt with a
    known token after the block of its first [MASK] (a block reads only the blocks before it: a later known token
    could not condition it)."""
    blocks = tokens.shape[1] // size
    default = type(config).__dataclass_fields__["schedule"].default
    if config.schedule != default or config.bernoulli:
        field = "bernoulli" if config.bernoulli else "schedule"
        raise InvalidSampler(field, "sampler blocks splits each block's masked positions evenly over its k steps "
                                    "(or by block_eb_gamma): it takes no schedule and no Bernoulli coins")
    if config.option("block_eb_gamma") is not None:
        if steps < blocks:
            raise InvalidSampler("steps", f"a block diffusion model of {blocks} blocks takes at least one step a "
                                          f"block: with block_eb_gamma, steps >= {blocks}, got {steps}")
    elif steps % blocks or not 1 <= steps // blocks <= size:
        raise InvalidSampler("steps", f"a block diffusion model of {blocks} blocks of {size} tokens takes k steps "
                                      f"a block: steps = {blocks} k with 1 <= k <= {size}, got {steps}")
    if not bool(scorable(tokens == mask_id, size).all()):
        raise InvalidSampler("prompt", f"a block diffusion model conditions on the blocks before the one it draws: "
                                       f"no known token may follow the block of {size} tokens holding the first "
                                       f"[MASK] (known tokens inside that block are fine)")


class BlockStep(ConfiguredStep):
    """By name only (a block diffusion model's runs must use it): the current block's next positions drawn
    jointly over the block alone (module docstring: which and how many); for constrained rows from the block's
    joint restricted to the block completions some accepted sequence continues (``constrained.block_automaton``:
    the automaton started where the committed tokens left it). ``joint: false`` draws each of them from its exact
    marginal instead (the rank-1 view of the block's joint, ``joint_step.marginal_step``), unconstrained only
    (the kind refuses a constraint with it). A row with a stop token ends at the block that completes holding it
    (``stop_after``)."""

    constrains = True
    Settings = BlockSettings

    def __init__(self, config):
        super().__init__(config)
        self.eb_gamma = self.settings.block_eb_gamma
        self.score_fn = None  # what ranks the block's masked positions (None: the run's predetermined order)
        if self.eb_gamma is not None:
            self.score_fn = eb_score(config.eb_proxy)
        elif config.ordering in ADAPTIVE:
            self.score_fn = ADAPTIVE[config.ordering]
        ranks = self.score_fn is not None
        self.adaptive = ranks and config.joint and config.adaptive_path == "exact"  # the chain rule in the block
        self.chooses = ranks and not self.adaptive  # the block joint's marginals choose, then one joint draw

    def plan(self, run):
        size = run.model.cfg.dit.block_size
        if not size:
            raise InvalidSampler("sampler", "sampler blocks takes a block diffusion model (dit.block_size > 0)")
        check_block_run(self.config, run.steps, run.tokens, run.mask_id, size)
        return None if self.score_fn is not None else super().plan(run)

    def _where(self, rows, n: torch.Tensor) -> torch.Tensor:
        """Each row's current block's positions [b, bs] (``n`` [b]: its masked positions): block step // k at k
        even steps a block; with EB the first holding a [MASK] (the blocks after it are wholly masked, those before
        committed), the last for a finished row."""
        size = rows.model.cfg.dit.block_size
        blocks = rows.length // size
        if self.eb_gamma is None:
            index = rows.step // (rows.steps // blocks)
        else:
            index = (blocks - (-(-n // size))).clamp(max=blocks - 1)
        return index[:, None] * size + torch.arange(size, device=n.device)[None]

    def counts(self, rows, n_current):
        """k even steps a block: the even split of the block's masked positions over its k steps, the first steps
        one more (``ttcore.sampling.blocks.block_counts`` for a whole block), the masked left over the steps left,
        rounded up. EB: -1 (the bound decides as the step chooses), or all the block has left where its deadline
        comes (no more steps left than blocks holding a [MASK]). The blocks after the current one are wholly
        masked (``check_block_run``), so its masked positions are the row's, less theirs."""
        size = rows.model.cfg.dit.block_size
        if self.eb_gamma is not None:
            todo = -(-n_current // size)  # blocks holding a [MASK], the current one first
            left = n_current - size * (todo - 1)
            return torch.where(rows.steps - rows.step <= todo, left, torch.full_like(left, -1)) * (n_current > 0)
        at = self._where(rows, n_current)
        k = rows.steps // (rows.length // size)
        after = rows.length - (at[:, -1] + 1)  # positions after the current block, all masked
        left = (n_current - after).clamp_min(0)
        return -(-left // (k - rows.step % k))  # ceil

    def prefix_needed(self, run) -> int:
        """Up to the current block's end (with EB the furthest row's): block-causal attention makes a block's
        features independent of the blocks after it, so the batched loop's forward runs the prefix alone without
        a cache (the committed blocks again each step)."""
        size = run.model.cfg.dit.block_size
        blocks = run.tokens.shape[1] // size
        if self.eb_gamma is not None:
            masked = run.tokens == run.mask_id
            return int(current_block_end(masked, size, torch.zeros_like(masked[:, 0], dtype=torch.long)).max())
        return (run.step_index // (run.steps // blocks) + 1) * size

    def active_steps(self, run) -> list[int] | None:
        """The steps of the blocks from the first holding a masked position on, less those of its steps that
        unmask nothing (fewer masked positions than k): a block the prompt gives runs no step. EB: None (its
        bound decides)."""
        if self.eb_gamma is not None:
            return None
        size = run.model.cfg.dit.block_size
        blocks = run.tokens.shape[1] // size
        k, n = run.steps // blocks, int(run.n_initial.max())
        if n == 0:
            return []
        todo = -(-n // size)  # blocks holding a masked position: the last ``todo``
        first, partial = blocks - todo, n - size * (todo - 1)  # the first one's masked positions
        return [first * k + j for j, count in enumerate(block_counts(partial, k)) if count] + \
            list(range((first + 1) * k, run.steps))

    def _block(self, rows, h, tokens, masked):
        """The current block's slice: its positions [b, bs], features, tokens, masked and automata (None: free)."""
        at = self._where(rows, masked.sum(1))
        hb = h.gather(1, at[..., None].expand(-1, -1, h.shape[-1]))
        automaton = None if rows.automaton is None else \
            block_automaton(rows.automaton, tokens, at[:, 0], at.shape[1])
        return at, hb, tokens.gather(1, at), masked.gather(1, at), automaton

    def choose(self, rows, h, tokens, masked, counts):
        if self.score_fn is None:  # the run's predetermined order
            inside = torch.zeros_like(masked).scatter_(1, self._where(rows, masked.sum(1)), True)
            return top_k_mask(rows.plan, masked & inside, counts)
        if self.adaptive:
            return None  # the chain rule picks as it draws
        at, hb, xb, mb, automaton = self._block(rows, h, tokens, masked)
        model, temperature = rows.model, rows.temperature
        if automaton is not None:  # the exact marginals of the block's constrained joint
            marg = constrained_marginals(model, hb, xb, mb, temperature, automaton)
        else:  # the exact marginals of the joint the block's draw draws from
            marg = model.format.marginals_at(model.head, hb, mb, mb, temperature, self.config.contraction)
        chosen = choice_by_marginals(marg.float(), mb, counts, self.score_fn, self.eb_gamma)
        return torch.zeros_like(masked).scatter_(1, at, chosen)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        at, hb, xb, mb, automaton = self._block(rows, h, tokens, masked)
        model = rows.model
        if self.adaptive:  # the block's joint by the exact chain rule, re-ranked after each pick
            vb = chain_rule_step(model, hb, xb, mb, counts, self.score_fn, rows.temperature, rows.streams,
                                 self.eb_gamma, automaton)
            cb = vb >= 0
        else:
            cb = chosen.gather(1, at)
            if automaton is not None:
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
