"""Request and response schemas of ``POST /score`` (pydantic): the sequences to score against a checkpoint
and what each scored."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .schema import MAX_PROMPT_CHARS, MAX_SEED, MAX_TIMEOUT_S, Decomposition, unicode_text

MAX_SCORE_SEQUENCES = 64
MAX_MC = 64


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"model": "qm9", "decomposition": "tt", "sequences": ["CC(=O)O", "c1ccccc1"]},
        {"model": "qm9", "sequences": ["CC(=O)O"], "template": "CC[MASK][MASK][MASK][MASK][MASK]"},
        {"model": "text", "sequences": ["The Congress shall"], "mode": "elbo", "num_mc": 16, "seed": 0},
    ]})

    model: str | None = Field(None, max_length=64, description="Model family, as in POST /generate.")
    decomposition: Decomposition | None = Field(None, description="As in POST /generate.")
    rank: int | None = Field(None, ge=1, le=1024, description="As in POST /generate.")
    checkpoint: str | None = Field(None, max_length=128, description="As in POST /generate.")
    sequences: list[str] = Field(min_length=1, max_length=MAX_SCORE_SEQUENCES,
                                 description=f"1..{MAX_SCORE_SEQUENCES} sequences (SMILES or text), each encoded "
                                             "to the model's length (padded).")
    template: str | None = Field(None, max_length=MAX_PROMPT_CHARS,
                                 description="Which positions are masked (scored): `[MASK]` where masked; every "
                                             "other position, including those after the template's end, keeps "
                                             "the sequence's own token (the template's tokens must match it). "
                                             "Default: every position masked. Joint mode only (a 422 in `elbo` "
                                             "mode, which draws its own masks).")
    mode: Literal["joint", "elbo"] = Field("joint", description="`joint`: the exact log p(x_M | x_t) and the "
                                                                "per-position log-marginals; `elbo`: the MDLM "
                                                                "bound on -log p(x), nats per token.")
    num_mc: int = Field(16, ge=1, le=MAX_MC, description=f"`elbo`: Monte Carlo draws of (t, mask), 1..{MAX_MC}.")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="`elbo`: RNG seed of the draws.")
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False,
        description="Deadline in seconds from arrival (at most the server's `--max-timeout-s`). Scoring runs in "
                    "pieces between generation steps; past the deadline it stops with 504, and a client that "
                    "leaves cancels it. A request whose estimated compute exceeds it is refused up front with a "
                    "422 naming the largest `num_mc` (or number of `sequences`) that fits.", examples=[30])

    @field_validator("sequences", "template")
    @classmethod
    def _unicode(cls, value):
        for text in value if isinstance(value, list) else [value] if value is not None else []:
            if len(text) > MAX_PROMPT_CHARS:
                raise ValueError(f"each sequence must have at most {MAX_PROMPT_CHARS} characters")
            unicode_text(text, "each sequence")
        return value


class Score(BaseModel):
    tokens: int = Field(description="Tokens of the encoded sequence (padding included: the model's length).")
    log_prob: float | None = Field(None, description="joint: log p(x_M | x_t), exact under the checkpoint's "
                                                     "joint (CP/TT; rank 1: the product), natural log. A block "
                                                     "diffusion checkpoint: the exact log-likelihood of its one "
                                                     "step a block sampler's law (temperature 1); at k > 1 steps "
                                                     "a block the sampler draws another law, whose likelihood "
                                                     "this is not (a NELBO would only bound it).")
    token_log_probs: list[float | None] | None = Field(
        None, description="joint: log p(x^i | x_t) per position under the joint's exact marginal; null where "
                          "not masked.")
    nelbo_per_token: float | None = Field(None, description="elbo: the MDLM bound (NELBO) of the sequence, per "
                                                            "real token (nats; its tokens before padding); exp of "
                                                            "it is the ELBO perplexity. `nelbo_terms` says which "
                                                            "positions' terms it sums. A bound for sampling from "
                                                            "the exact marginals; the TT head contraction samples "
                                                            "another distribution.")
    nelbo_terms: Literal["all", "real"] | None = Field(
        None, description="elbo: `all`: every position's term, padding included (families of variable length, "
                          "which generate the padding: a bound on -log p(x) of the sequence); `real`: the real "
                          "tokens' terms only (families cut into fixed-length blocks, which never generate "
                          "padding: for a sequence shorter than the block, the real tokens' share of the bound, "
                          "not a bound on its likelihood; for a full block, the bound).")
    stderr: float | None = Field(None, description="elbo: the sample standard error of nelbo_per_token over the "
                                                   "draws; the draws are heavy-tailed (1/t weights), so at a few "
                                                   "draws it understates the spread: a rough figure.")
    real_tokens: int | None = Field(None, description="Tokens of the sequence before padding.")


class ScoreResponse(BaseModel):
    model: str
    checkpoint: str
    decomposition: str
    rank: int
    mode: str
    scores: list[Score]
