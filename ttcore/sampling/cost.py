"""What one denoising step holds in memory, from the model's shape alone: the service admits and
micro-batches requests by it. Calibrated against peak RSS on the bundled checkpoints
(``benchmarks/request_memory.py`` prints measured beside estimated; README, Limits)."""

from dataclasses import fields

from .config import SamplerConfig
from .steps import step_settings

CHAIN_RULE_COPIES = 4.5  # full factors / cores alive at once in a chain-rule step (measured 3.2-4.1 at text size)
ROW_SLACK_BYTES = 2 << 20  # per sequence: features, marginals, scores (measured 1.2 MB at QM9 size)
FORWARD_BYTES_PER_TOKEN_WIDTH = 48  # backbone activations per token per hidden unit (bf16 and float32 mixed)


def chain_rule_row_bytes(cfg) -> int:
    """One sequence of an adaptive-ordering / EB step: the joint over all its positions (rank 1: float64
    probabilities; CP / TT: float32 factors or cores, Sec. 4.3), ``CHAIN_RULE_COPIES`` times."""
    l, v = cfg.dit.length, cfg.dit.out_vocab
    fmt = cfg.format
    per_row = l * v * fmt.outputs_per_position(cfg.rank) * fmt.joint_dtype.itemsize
    return int(CHAIN_RULE_COPIES * per_row) + ROW_SLACK_BYTES


def predetermined_row_bytes(cfg) -> int:
    """One sequence of a predetermined step: the chosen positions' logits and float64 probabilities
    (at most all positions) and the contracted cores."""
    l, v, r = cfg.dit.length, cfg.dit.out_vocab, cfg.rank
    return 2 * l * v * 8 + l * r * r * 8 + ROW_SLACK_BYTES


def chooser_row_bytes(cfg, outputs: int | None = None) -> int:
    """One sequence of the fast adaptive step's choice (``steps.fast_adaptive``): c head outputs of every
    position (logits and float32 probabilities) and the [l, v] marginals it scores; ``outputs``: the request's
    c (None: the default)."""
    from .steps.fast_adaptive import chooser_outputs  # the step module owns c

    l, v = cfg.dit.length, cfg.dit.out_vocab
    c = chooser_outputs(cfg.format.outputs_per_position(cfg.rank), v, outputs)
    return l * v * (c * 8 + 4)


SUMMING_COPIES = 3  # a summing pass holds its head outputs as float64 logits, tempered probabilities and sums


def exact_contraction_bytes(cfg) -> int:
    """A step that sums every masked position's full head outputs (TT's exact contraction): the values its
    format holds at once for that (``Decomposition.summing_values``), in float64, ``SUMMING_COPIES`` times,
    independent of the number of sequences."""
    return SUMMING_COPIES * 8 * cfg.format.summing_values(cfg.rank, cfg.dit.out_vocab)


def summed_outputs_bytes(cfg) -> int:
    """What a step that sums or holds full head outputs reserves whatever its number of sequences: the exact
    contraction's chunk (``exact_contraction_bytes``), or one sequence's full outputs at every position (float32,
    ``SUMMING_COPIES`` times: EDLM's joint proposals' likelihoods, ``steps.edlm.joint_proposals``) if larger."""
    one_row = SUMMING_COPIES * 4 * cfg.dit.length * cfg.dit.out_vocab * cfg.format.outputs_per_position(cfg.rank)
    return max(exact_contraction_bytes(cfg), one_row)


def kv_cache_row_bytes(cfg, copies: int = 2) -> int:
    """The key-value cache of one sequence a generation of its kind holds, ``copies`` times
    (``ModelKind.cache_row_bytes``; 0 for a masked diffusion model)."""
    return cfg.kind.cache_row_bytes(cfg, copies)


def forward_row_bytes(cfg) -> int:
    """Backbone activations of one sequence in one forward pass (inference: nothing kept for backward), and an
    autoregressive model's key-value cache."""
    return FORWARD_BYTES_PER_TOKEN_WIDTH * cfg.dit.length * cfg.dit.hidden_dim + kv_cache_row_bytes(cfg)


def step_row_bytes(cfg, adaptive: bool, chooses: bool = False, chooser_outputs: int | None = None,
                   ar_cfg=None) -> int:
    """Peak bytes per sequence of one step (``chooses``: the fast adaptive step's choice comes first, with
    ``chooser_outputs`` outputs per position; ``ar_cfg``: the step holds that autoregressive model's key-value
    cache of its rows, one copy: ``Step.ar_cache``)."""
    extra = kv_cache_row_bytes(ar_cfg, copies=1) if ar_cfg is not None else 0
    if adaptive:
        return forward_row_bytes(cfg) + chain_rule_row_bytes(cfg) + extra
    return forward_row_bytes(cfg) + predetermined_row_bytes(cfg) + extra + (
        chooser_row_bytes(cfg, chooser_outputs) if chooses else 0)


def rows_per_pass(cfg, adaptive: bool, budget_bytes: int, exact: bool = False, chooses: bool = False,
                  chooser_outputs: int | None = None, ar_cfg=None) -> int:
    """How many sequences one pass of a step may hold within ``budget_bytes``; 0 when not even one fits.
    ``exact``: a TT step that sums the cores (counted for predetermined steps only); ``ar_cfg``: as
    ``step_row_bytes``."""
    fixed = summed_outputs_bytes(cfg) if exact and not adaptive else 0
    return max(0, (budget_bytes - fixed) // step_row_bytes(cfg, adaptive, chooses, chooser_outputs, ar_cfg))


def sampler_config(**settings) -> SamplerConfig:
    """The SamplerConfig of flat settings (a run's own, such as the seed, ignored)."""
    names = {f.name for f in fields(SamplerConfig)} | set(step_settings())
    return SamplerConfig(**{k: v for k, v in settings.items() if k in names})


def step_kind(cfg, **settings) -> tuple[bool, bool]:
    """``(adaptive, exact)`` of a run's steps on a model with ``cfg``, from flat settings: the sampler's step
    class and the model's format answer (``SamplerConfig.step_kind``)."""
    return sampler_config(**settings).step_kind(cfg)


def rows_for(cfg, budget_bytes: int, **settings) -> int:
    """``rows_per_pass`` of a run with these flat settings (its step class says what a step holds)."""
    config = sampler_config(**settings)
    adaptive, exact = config.step_kind(cfg)
    return rows_per_pass(cfg, adaptive, budget_bytes, exact, config.step.chooses,
                         config.option("chooser_outputs"))
