"""Response schemas of ``GET /models`` (pydantic): each loaded checkpoint's facts and this server's current
compute estimates for it."""

from pydantic import BaseModel, Field


class ModelInfo(BaseModel):
    model: str
    checkpoint: str
    kind: str = Field("diffusion", description="The model kind (`ttcore.kinds`): `diffusion` (full-sequence masked "
                      "diffusion), `autoregressive` or `block_diffusion` (autoregressive over blocks, diffusion "
                      "inside each); a kind decides the orderings, prompts and scores it serves.")
    base: str = Field(
        "mdlm", description="The base model: `mdlm` (masked diffusion), `vadd` (a latent z ~ N(0, I) per sequence, "
        "fixed through the steps; paper Sec. 4.4), `di4c` (a distilled mixture: z ~ N(0, I) drawn again at every "
        "step, so each step draws from E_z prod_i p(x^i | x_t, z); Hayakawa et al. 2025) or `ar` (the family's "
        "autoregressive model: one token a step, left to right; `steps` defaults to its length; asked for by "
        "`checkpoint` only) or `bd3lm` (block diffusion: `sampler: blocks`, `steps` k times its blocks, one step a "
        "block by default; asked for by `checkpoint` only) or `sdar` (the same, its inputs shifted right as the "
        "autoregressive model's it started from; `ordering` inside a block left to right unless set: a block's last "
        "token is read by the next block only).")
    block_size: int = Field(0, description="A block diffusion checkpoint's tokens per block (0: not one): `steps` is "
                                           "k times its length / block_size blocks, 1 <= k <= block_size (k steps "
                                           "a block; k = 1: each block one exact joint draw), or with "
                                           "`block_eb_gamma` (EB inside each block) a cap of at least the blocks.")
    default_steps: int | None = Field(None, description="The steps a request that sets none gets here (a block "
                                                        "model's blocks, an AR model's length, a distilled "
                                                        "checkpoint's own count); null: the API's default.")
    ar_pair: str | None = Field(None, description="The autoregressive checkpoint that `sampler: edlm` and `dcd` "
                                                  "consult for this one (its family's, same tokenizer); null: "
                                                  "those samplers are refused here.")
    latent_dim: int = Field(0, description="VADD / Di4C: the dimension of z (0 for mdlm).")
    grammars: list[str] = Field([], description="The grammars `grammar` may name for this checkpoint (`smiles` for "
                                                "SMILES tokens); any checkpoint takes `regex`.")
    domain: str = Field(description="The tokenizer's kind: `smiles`, `char` or `text` (BPE).")
    metrics: str = Field(
        "none", description="What its family is measured by, a registered kind (`ttcore.metrics.kinds`): "
        "`molecules` (answers carry RDKit's fields, `valid_only` applies), `text`, or `none` (the sequences only).")
    validates: bool = Field(False, description="Its metrics check each sample: answers carry `valid`, and "
                                               "`valid_only` applies (molecules: RDKit).")
    depicts: bool = Field(False, description="Its samples can be drawn (`GET /depict`: molecules).")
    decomposition: str
    rank: int
    outputs_per_position: int = Field(
        1, description="Head outputs per masked position (E: 1 for rank 1, r for CP, r^2 for TT). A request that "
                       "names no decomposition or rank gets its family's checkpoint with the most (then the higher "
                       "rank).")
    head: str
    length: int
    vocab_size: int
    parameters: int
    card_url: str | None = Field(None, description="Where its model card (markdown: how it was trained and "
                                                   "evaluated, its tables) is served; null without a card.")
    summary: list[str] = Field(default_factory=list, description="The card's summary lines (steps, validation "
                                                                "metrics), so a client need not fetch the card.")
    distilled: dict | None = Field(None, description="A distilled checkpoint (`training/distill.py`): its "
                                   "`teacher`, `objective`, `steps` (what it was distilled for, and what a request "
                                   "that sets no `steps` gets) and `teacher_steps`; a progressive run's students "
                                   "also its `rounds` and `first_teacher`; null otherwise.")
    estimated_seconds: dict[str, float] = Field(
        default_factory=dict, description="Admission's current compute estimates on this server, per sequence "
        "(an upper bound of recent requests, approximate: a timing taken when a request first needed the kind, "
        "times the largest ratio of measured to timed among the kind's last 8 requests; a kind no request has "
        "needed yet is absent): `predetermined_step`, `exact_step` (a TT step with the exact contraction), "
        "`tempered_step` (a CP / TT step at a temperature other than 1; `tempered_chooser_step` with "
        "`adaptive_path: fast`), `chooser_step` (a step of "
        "`adaptive_path: fast`), `chain_rule` (the picks of a whole `adaptive_path: exact` generation). A step "
        "of n sequences is estimated as its kind's `estimated_step_overhead_seconds` plus n times this while n is "
        "at most its `estimated_timed_rows`, each sequence beyond those costing 1.3 times this (scaled up for "
        "more `chooser_outputs` than the default).")
    estimated_step_overhead_seconds: dict[str, float] = Field(
        default_factory=dict, description="Admission's per-step overhead of each step kind (whatever the number "
        "of sequences), from its timing, with the same ratio.")
    estimated_timed_rows: dict[str, int] = Field(
        default_factory=dict, description="The sequences each step kind's timing ran in one step (fewer on a "
        "slow machine: a timing stops growing its batch at about 0.1 s a step); a larger step's sequences "
        "beyond these are estimated at 1.3 times the per-sequence figure.")
    adaptive_paths: list[str] = Field(
        default_factory=lambda: ["fast", "exact"], description="The `adaptive_path` values this checkpoint serves.")


class ModelList(BaseModel):
    models: list[ModelInfo]
