"""Block diffusion (BD3-LM: Arriola et al., ICLR 2025): the DiT with block-causal attention
(``DiTConfig.block_size``, ``ttcore.models.block_attention``), autoregressive over blocks and a masked diffusion
model inside each, with the format's joint over a block's masked positions (rank 1, CP or TT: a block is a joint
over b positions). It generates block by block (``ttcore.sampling.blocks``) and its likelihood at one step per
block is exact, log p(x) = sum_B log p(x_B | x_{<B}) (``exact_nll``); training is
``ttcore.losses.block_diffusion_loss``. In the batched loop (``GenerationRun``, the service) its runs take
``sampler: blocks`` (``ttcore.sampling.steps.block``); /score gives its exact log-likelihood
(``ttcore.sampling.blocks.block_score``)."""

import torch

from ttcore.errors import InvalidSampler

from .base import ModelKind


class BlockDiffusion(ModelKind):
    name = "block_diffusion"
    description = "a block diffusion model"
    holds_cache = True  # the committed blocks' keys and values (``ttcore.models.block_cache``)
    stops = True  # at the block holding the stop token (text's end-of-text)
    constrains = True  # each block from its joint restricted by the automaton started where the blocks before left it
    elbo = False
    exact_likelihood = True
    by_default = False  # answers only requests that name its checkpoint
    score_width = 2  # its exact score is one pass over [x_t, x_0] (``block_score``)

    def matches(self, cfg) -> bool:
        return cfg.dit.block_size > 0

    def check_config(self, cfg) -> None:
        if cfg.backbone is not None or cfg.dit.latent_dim:
            raise ValueError("a block diffusion model is the DiT without a latent (no pretrained backbone, no VADD)")

    def base(self, cfg) -> str:
        return "sdar" if cfg.dit.causal else "bd3lm"  # shifted inputs: started from an autoregressive model

    def model_id(self, family: str, cfg) -> str:
        return f"{family}-blocks{cfg.dit.block_size}-{cfg.decomposition}-r{cfg.rank}"

    def default_steps(self, cfg) -> int:
        return cfg.dit.length // cfg.dit.block_size  # one step a block: each block one exact joint draw

    def request_defaults(self, cfg=None) -> dict:
        """``sampler: blocks``; for a model with shifted inputs (``DiTConfig.causal``, started from an AR model)
        also ``ordering: left_to_right`` inside a block: its block's last token is an input of the next block only,
        so an order that unmasks it before the others draws them without reading it (QM9 b = 4 at two steps a
        block: 43.6% valid in random order, 72.9% left to right; docs/block-diffusion.md)."""
        shifted = cfg is not None and cfg.dit.causal
        return {"sampler": "blocks", **({"ordering": "left_to_right"} if shifted else {})}

    def calibration(self, settings: dict, steps: int, cfg) -> tuple[dict, int, bool]:
        """The mean step of a one-step-a-block run, timed over the whole run: with the cache its first step runs
        one block, each later one two (the block committed before and the new one), each with one block's joint
        draw; the dearest mean of any k (more steps a block add steps of one block)."""
        return dict(settings, sampler="blocks"), self.default_steps(cfg), True

    def cached_features(self, model, runs: list, sizes: list[int], x: torch.Tensor) -> tuple[torch.Tensor, list]:
        """Every row's current block over its run's cache of the committed blocks, one backbone call for all
        (``ttcore.models.block_cache.cached_block_features``)."""
        from ttcore.models.block_cache import cached_block_features

        return cached_block_features(model, [run.kv for run in runs], sizes, x)

    def cache_row_bytes(self, cfg, copies: int = 2) -> int:
        """Every layer's keys and values at every position and the pad's, float32 (an upper bound under bf16),
        ``copies`` times (held between steps, copied once more when runs step together)."""
        return copies * 2 * cfg.dit.n_blocks * (cfg.dit.length + 1) * cfg.dit.hidden_dim * 4

    def check_run(self, config, steps: int, tokens: torch.Tensor, mask_id: int, constrained: bool) -> None:
        """Its runs take ``sampler: blocks`` (``ttcore.sampling.steps.block``, whose plan checks the steps, the
        ordering and the prompt against the model's blocks)."""
        super().check_run(config, steps, tokens, mask_id, constrained)
        if config.sampler != "blocks":
            raise InvalidSampler("sampler", "a block diffusion model generates with sampler blocks (block by block)")
        if constrained and not config.joint:
            raise InvalidSampler("joint", "joint: false draws each position of a block from its marginal, which no "
                                          "constraint restricts: a constrained block is drawn from its joint")

    def score_refusal(self, cfg, mask: torch.Tensor) -> str | None:
        from ttcore.sampling.blocks import scorable

        if bool(scorable(mask, cfg.dit.block_size).all()):
            return None
        return (f"a block diffusion model scores whole blocks after the first scored one: no known token may follow "
                f"the block of {cfg.dit.block_size} tokens holding the first [MASK]")

    def score(self, model, x0: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact: ``ttcore.sampling.blocks.block_score`` (the k = 1 sampler's law given the known positions)."""
        from ttcore.sampling.blocks import block_score

        return block_score(model, x0, mask)

    def objective(self, cfg, mask_id: int, eps: float):
        """BD3-LM's, each block at its own time (``ttcore.losses.block_diffusion_loss``)."""
        from ttcore.losses import block_diffusion_loss

        def loss(model, x0, generator=None, step: int = 0) -> dict:
            return block_diffusion_loss(model, x0, mask_id, eps, generator=generator)
        return loss

    def exact_nll(self, model, x0: torch.Tensor) -> torch.Tensor:
        """-log p(x0) per position, the mean over the batch (``block_log_prob``), as the AR kind's."""
        from ttcore.sampling.blocks import block_log_prob

        return -block_log_prob(model, x0).mean() / x0.shape[1]


BLOCK_DIFFUSION = BlockDiffusion()
