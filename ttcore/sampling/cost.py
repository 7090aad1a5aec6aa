"""The cost model of a run's steps, from the model's shape and the run's settings alone: what one step holds in
memory per sequence (``run_row_bytes``, ``run_rows``: the service micro-batches requests by it, the recipes
size their passes by it) and what kind of work it does and how much (``work_of``: what the service's measured
rates, ``service.speed``, multiply). Memory calibrated against peak RSS on the bundled checkpoints
(``benchmarks/request_memory.py`` prints measured beside estimated; README, Limits)."""

from dataclasses import dataclass, fields

from ttcore.kinds import companion

from .config import SamplerConfig
from .steps import WorkKind, step_settings

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


def automaton_row_bytes(cfg, constraint) -> int:
    """A constrained step's automaton memory per sequence: its backward messages (l + 1 of r x Q, float64) and
    one position's gathered message (r x Q x C), r the format's rank."""
    q, c = constraint.num_states, constraint.classes[1].shape[1]
    return 8 * cfg.rank * q * (cfg.dit.length + 1 + c)


def _companion_cfg(model, config: SamplerConfig):
    """The config of the autoregressive model whose key-value cache of its rows a step of ``config`` holds (DCD's
    draw: ``Step.ar_cache``), or None."""
    ar = companion(model) if config.step.ar_cache else None
    return None if ar is None else ar.cfg


def run_row_bytes(model, config: SamplerConfig, constraint=None) -> int:
    """Peak bytes per sequence of one step of a run of ``model`` with ``config``: ``step_row_bytes`` of its step
    class; within ``constraint`` (a ``TokenDFA``), every masked position's full outputs (as the chain rule holds)
    and the automaton's messages."""
    cfg = model.cfg
    if constraint is not None:
        return step_row_bytes(cfg, True) + automaton_row_bytes(cfg, constraint)
    adaptive, _ = config.step_kind(cfg)
    return step_row_bytes(cfg, adaptive, config.step.chooses, config.option("chooser_outputs"),
                          _companion_cfg(model, config))


def run_rows(model, config: SamplerConfig, budget_bytes: int, constraint=None) -> int:
    """How many sequences one pass of a step of the run ``run_row_bytes`` describes may hold within
    ``budget_bytes`` (an exact-contraction step's fixed reserve first: ``summed_outputs_bytes``); 0 when not even
    one fits."""
    if constraint is not None:
        return max(0, budget_bytes // run_row_bytes(model, config, constraint))
    adaptive, exact = config.step_kind(model.cfg)
    return rows_per_pass(model.cfg, adaptive, budget_bytes, exact, config.step.chooses,
                         config.option("chooser_outputs"), _companion_cfg(model, config))


def rows_for(model, budget_bytes: int, **settings) -> int:
    """``run_rows`` of a run with these flat settings, unconstrained."""
    return run_rows(model, sampler_config(**settings), budget_bytes)


REFERENCE_STATES, REFERENCE_CLASSES = 128, 16  # the automaton a constrained step is timed with


def reference_automaton(vocab: int):
    """An automaton of ``REFERENCE_STATES`` states over ``REFERENCE_CLASSES`` token classes (fewer when the
    vocabulary is smaller), accepting every sequence: what ``constrained_step`` is timed with."""
    import torch

    from ttcore.constraints import TokenDFA

    classes = min(REFERENCE_CLASSES, vocab)
    q = torch.arange(REFERENCE_STATES)[:, None]
    delta = (7 * q + torch.arange(vocab)[None] % classes + 1) % REFERENCE_STATES
    return TokenDFA.of_tokens(delta, torch.ones(REFERENCE_STATES, dtype=torch.bool))


@dataclass(frozen=True)
class Work:
    """A run's kind of work (what a measured rate is kept for) and ``scale``, its settings' per-sequence step cost
    relative to the timed step's (``work_of``)."""
    kind: WorkKind
    scale: float = 1.0


def work_of(model_cfg, config: SamplerConfig, steps: int, constraint=None) -> Work:
    """The work of a run with ``config`` at ``steps`` steps: its step's kind and scale (``Step.work_kind``,
    ``Step.work_scale``: what its own settings cost over the timed step's). The step count needs no scale: the
    timing's run takes one step, the most positions a step can draw. A constrained run (``constraint``, a
    ``TokenDFA``) is a ``constrained_step``, scaled by its automaton's states x token classes over the timing's
    (``reference_automaton``) when larger: the messages' work is proportional to them (an upper bound again)."""
    if constraint is not None:
        size = constraint.num_states * constraint.classes[1].shape[1]
        return Work(WorkKind.constrained_step, max(1.0, size / (REFERENCE_STATES * REFERENCE_CLASSES)))
    return Work(config.work_kind(model_cfg), config.step.work_scale(model_cfg))
