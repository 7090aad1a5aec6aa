"""What a model kind is, and the registry of kinds (``ttcore.decompositions``' registry is the model)."""

import torch

from ttcore.errors import InvalidSampler
from ttcore.registry import Registry


class ModelKind:
    """What a checkpoint's architecture means to the samplers, the scorer and the service, answered by the kind
    rather than asked of a flag. The defaults are a full-sequence masked diffusion model's; a kind overrides what
    differs. ``kind_of(cfg)`` picks the most recently registered kind whose ``matches`` holds."""

    name = ""
    description = ""  # in refusals' words: "a masked diffusion model"
    holds_cache = False  # its steps read a key-value cache (``cached_features``)
    stops = False  # a run may end a sequence at a stop token (``GenerationRun.stop_token``): its steps finish
    # blocks in order, so nothing after the block that drew it is drawn
    constrains = True  # a regex or grammar restricts its steps' joint of the masked positions
    elbo = True  # /score's ELBO mode is a bound on its likelihood
    exact_likelihood = False  # log p(x) of a whole sequence is exact (``exact_nll``)
    companion = False  # it is the autoregressive model EDLM and DCD consult beside a diffusion checkpoint
    joint_heads = True  # a CP or TT head may sit on it (``JointModel.from_base`` fine-tunes one on its rank 1)
    takes_companion = False  # it can be paired with such a companion (``ttcore.kinds.autoregressive.pair``)
    by_default = True  # it answers a request that names no checkpoint
    score_width = 1  # a /score pass runs this many times the length a sequence (admission counts it as that many
    # rows: an approximation, attention's share grows with the square)

    def matches(self, cfg) -> bool:
        """Whether a model of ``cfg`` (a ``ModelConfig``) is of this kind."""
        raise NotImplementedError

    def check_config(self, cfg) -> None:
        """Raise ValueError for a ``ModelConfig`` this kind cannot be."""

    def base(self, cfg) -> str:
        """The model's kind as ``/models`` reports it (``mdlm``, ``vadd``, ``di4c``, ``ar``)."""
        return self.name

    def head_label(self, cfg) -> str:
        """The head as model cards name it: 1layer / 2layer, ``base`` for rank 1 (the MDM's W)."""
        return cfg.head if cfg.format.joint_head else "base"

    def model_id(self, family: str, cfg) -> str:
        """The /v1 model id: family-decomposition-rRANK."""
        return f"{family}-{cfg.decomposition}-r{cfg.rank}"

    def default_steps(self, cfg) -> int | None:
        """The steps a request that sets none gets (None: the API's default)."""
        return None

    def request_defaults(self, cfg=None) -> dict:
        """Sampler settings this kind fixes when a request leaves them unset (request field -> value); ``cfg`` (the
        checkpoint's ``ModelConfig``, optional): those its own model asks for too."""
        return {}

    def check_run(self, config, steps: int, tokens: torch.Tensor, mask_id: int, constrained: bool) -> None:
        """Raise ``InvalidSampler`` for a generation this kind cannot make: sampler ``config`` (a
        ``SamplerConfig``), ``steps``, the run's tokens [b, l] with ``mask_id`` where masked."""
        if constrained and not self.constrains:
            raise InvalidSampler("regex", f"{self.description} takes no constraint: its steps draw no joint of the "
                                          "masked positions to restrict")

    def score_refusal(self, cfg, mask: torch.Tensor) -> str | None:
        """Why positions ``mask`` [b, l] (bool) of a model of config ``cfg`` cannot be scored exactly, or None."""
        return None

    def score(self, model, x0: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x0 [b, l], the scored positions ``mask`` [b, l] -> (log p(x_M | the rest) [b] float64, per position
        log p(x^i | the rest) [b, l] float64, NaN where not scored). Exact for the model's joint p(x_M | x_t)."""
        raise NotImplementedError

    def exact_nll(self, model, x0: torch.Tensor) -> torch.Tensor | None:
        """-log p(x0) per position (padding included), for a kind with ``exact_likelihood``."""
        raise NotImplementedError

    def objective(self, cfg, mask_id: int, eps: float):
        """The training loss of this kind's models, ``objective(model, x0, generator, step)`` -> a dict with
        ``loss``, ``nll`` and ``lc`` (the recipes' loop contract), or None: MDLM's (``ttcore.losses.mdlm_loss``,
        VADD's ``vadd_loss`` with a latent), which the loop runs itself (in micro-batches, data-parallel shares)."""
        return None

    def cache_row_bytes(self, cfg, copies: int = 2) -> int:
        """The key-value cache of one sequence a generation holds (``copies`` of it), bytes; 0 without one."""
        return 0

    def cached_features(self, model, runs: list, sizes: list[int], x: torch.Tensor) -> tuple[torch.Tensor, list]:
        """For a kind that ``holds_cache``: the features [B, l, d] one step of ``runs`` (``GenerationRun``s, rows
        ``sizes`` each, x [B, l] their tokens in order) reads, from each run's cache (``run.kv``, None: none yet),
        and each run's cache after the step."""
        raise NotImplementedError

    def calibration(self, settings: dict, steps: int, cfg) -> tuple[dict, int, bool]:
        """How the service times a step of this kind: (settings, steps, whether to time the whole run: a cached
        kind's first step fills its cache, so only the run's mean step is its cost)."""
        return settings, steps, False


MODEL_KINDS: Registry = Registry("model kind")  # the kinds models are recognised as (``kind_of``)
register_kind = MODEL_KINDS.register
unregister_kind = MODEL_KINDS.unregister
get_kind = MODEL_KINDS.named


def kind_of(cfg) -> ModelKind:
    """The kind of a model of ``cfg`` (a ``ModelConfig``): the most recently registered whose ``matches`` holds
    (the full-sequence diffusion kind, registered first, matches every model)."""
    for kind in reversed(MODEL_KINDS.values()):
        if kind.matches(cfg):
            return kind
    raise ValueError("no registered model kind matches this model")
