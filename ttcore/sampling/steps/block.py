"""Block diffusion's step (``sampler: blocks``) for the batched loop (``GenerationRun``, ``batch_step``): a block
diffusion model's run of K = k x (blocks) steps denoises block B in steps kB .. kB + k - 1, each drawing the
next positions of the run's predetermined order inside the block jointly from the format's joint over the
block's masked positions given the blocks before it (``ttcore.kinds.block_diffusion``); k = 1 is one exact joint
draw a block, whose law is ``ttcore.sampling.blocks.block_log_prob``'s. The backbone call is the loop's own
forward of the whole sequence (block-causal: the current block's features read only the committed blocks), so the
step needs nothing of its own beyond the block's slice; ``ttcore.sampling.blocks.generate_blocks`` is the same
algorithm over a key-value cache, outside the batched loop."""

import torch

from ttcore.errors import InvalidSampler

from ..orderings import PREDETERMINED, top_k_mask
from .base import ConfiguredStep


def check_block_run(config, steps: int, tokens: torch.Tensor, mask_id: int, size: int) -> None:
    """Refuse (``InvalidSampler`` naming the field) what a block diffusion run of ``sampler: blocks`` cannot be
    (another sampler is the kind's refusal, ``BlockDiffusion.check_run``): an adaptive ordering, a step count
    that is not k steps for each block (1 <= k <= b), a prompt."""
    blocks = tokens.shape[1] // size
    if config.ordering not in PREDETERMINED:
        raise InvalidSampler("ordering", f"sampler blocks takes a predetermined ordering ({', '.join(PREDETERMINED)})"
                                         f", got {config.ordering!r}")
    if steps % blocks or not 1 <= steps // blocks <= size:
        raise InvalidSampler("steps", f"a block diffusion model of {blocks} blocks of {size} tokens takes k steps "
                                      f"a block: steps = {blocks} k with 1 <= k <= {size}, got {steps}")
    if not bool((tokens == mask_id).all()):
        raise InvalidSampler("prompt", "a block diffusion model takes no prompt yet (every position masked)")


class BlockStep(ConfiguredStep):
    """The current block's next positions by the run's order, drawn jointly over the block alone."""

    @classmethod
    def accepts(cls, config) -> bool:
        return False  # by name, which a block diffusion model's runs must use

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
        """The even split of the block over its k steps (``ttcore.sampling.blocks.block_counts``)."""
        _, j, k = self._where(rows)
        size = rows.model.cfg.dit.block_size
        return size // k + (j < size % k).long()

    def choose(self, rows, h, tokens, masked, counts):
        at, _, _ = self._where(rows)
        inside = torch.zeros_like(masked).scatter_(1, at, True)
        return top_k_mask(rows.plan, masked & inside, counts)

    def draw(self, rows, h, tokens, masked, chosen, counts):
        at, _, _ = self._where(rows)
        hb = h.gather(1, at[..., None].expand(-1, -1, h.shape[-1]))
        xb, mb, cb = tokens.gather(1, at), masked.gather(1, at), chosen.gather(1, at)
        model = rows.model
        vb = model.format.draw(model.head, hb, xb, mb, cb, rows.temperature, rows.streams, self.config.contraction)
        values = torch.full_like(tokens, -1)
        return values.scatter_(1, at, torch.where(cb, vb, -1))
