"""Request and response schemas of the HTTP API (pydantic). A request converts itself to the
sampler's settings; every field is documented with its rule and an example for the OpenAPI page."""

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from ttcore.constraints import GRAMMARS, MAX_STATES
from ttcore.constraints.regex import MAX_PATTERN
from ttcore.decompositions import CONTRACTIONS, DECOMPOSITIONS
from ttcore.sampling import ADAPTIVE, EB_PROXIES, PREDETERMINED, SCHEDULES, SamplerConfig
from ttcore.sampling.steps import named_sampler, sampler_names, step_settings


def registered(names, what: str):
    """A name that must be in ``names()`` when a request is validated (so a format or sampler registered
    after import is accepted); the OpenAPI document lists the names registered when it is built."""
    def check(value: str) -> str:
        if value not in names():
            raise ValueError(f"{what} must be one of {', '.join(names())}")
        return value
    return Annotated[str, AfterValidator(check), Field(json_schema_extra=lambda schema: schema.update(enum=names()))]


# the API's choices are the library's registries: a new ordering, schedule, format or sampler appears here
Decomposition = registered(lambda: list(DECOMPOSITIONS), "decomposition")
Sampler = registered(sampler_names, "sampler")
Grammar = registered(lambda: list(GRAMMARS), "grammar")
Ordering = Literal[tuple(PREDETERMINED) + tuple(ADAPTIVE)]
Schedule = Literal[tuple(SCHEDULES)]
EBProxy = Literal[tuple(EB_PROXIES)]
Contraction = Literal[CONTRACTIONS]

MAX_STEPS = 1024
MAX_SAMPLES = 256
MAX_PROMPT_CHARS = 8192
MIN_TEMPERATURE = 0.01  # the smallest T served: the power 100, near-greedy (not argmax: near ties are drawn)
MAX_TIMEOUT_S = 3600
MAX_SEED = 2**53 - 1  # the largest integer every JSON reader holds exactly
MAX_VALID_ROUNDS = 4  # valid_only: rounds of num_samples draws at most (a bounded cost, admitted round by round)
ROUND_SEED_STRIDE = 1_000_003  # valid_only with a seed: round k draws with seed + k * stride


def unicode_text(text: str, what: str) -> str:
    """``text`` if it encodes as UTF-8 (JSON's escapes can carry a lone surrogate, which no tokenizer reads);
    ValueError naming ``what`` otherwise."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid Unicode text (it holds a lone surrogate)") from None
    return text


_SETTINGS_MODEL: dict = {}  # the declared settings' key -> their model (one entry: the registry as last read)


def step_settings_model() -> type[BaseModel]:
    """The step classes' own settings as one strict pydantic model (``ttcore.sampling.steps.step_settings``: each
    field's default, bounds and description are its declaration's), for the samplers registered now (so one
    registered after import is served, as ``registered`` names are)."""
    declared = step_settings()
    key = tuple((name, owner) for name, (_, _, owner) in declared.items())
    if key not in _SETTINGS_MODEL:
        def field(f, kind):
            m = f.metadata
            extra = {"allow_inf_nan": False} if float in getattr(kind, "__args__", (kind,)) else {}
            return kind, Field(f.default, ge=m["ge"], gt=m["gt"], le=m["le"], description=m["doc"], **extra)
        _SETTINGS_MODEL.clear()
        _SETTINGS_MODEL[key] = create_model("StepSettingFields", __config__=ConfigDict(extra="forbid", strict=True),
                                            **{name: field(f, kind) for name, (f, kind, _) in declared.items()})
    return _SETTINGS_MODEL[key]


class SamplerFields(BaseModel):
    """The sampler's fields, typed once: ``POST /generate`` and ``POST /v1/completions`` (as extensions) both
    take them; ``to_sampler_config`` turns them into the library's ``SamplerConfig``. Each step class's own
    settings are fields too, validated by their declarations (``step_settings_model``) and kept as
    ``step_settings``."""
    model_config = ConfigDict(extra="forbid", strict=True)
    _step_settings: dict = PrivateAttr(default_factory=dict)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        """The OpenAPI document lists the step settings registered when it is built beside the shared fields."""
        schema = handler.resolve_ref_schema(handler(core_schema))
        schema.setdefault("properties", {}).update(step_settings_model().model_json_schema()["properties"])
        return schema

    @model_validator(mode="wrap")
    @classmethod
    def _split_step_settings(cls, data, handler):
        if not isinstance(data, dict):
            return handler(data)
        model = step_settings_model()
        own = {k: v for k, v in data.items() if k in model.model_fields}
        errors, settings, out = [], None, None
        try:
            settings = model.model_validate(own)
        except ValidationError as e:
            errors += e.errors()
        try:
            out = handler({k: v for k, v in data.items() if k not in own})
        except ValidationError as e:
            errors += e.errors()
        if errors:  # both parts' errors, as one body's
            raise ValidationError.from_exception_data(cls.__name__, [
                {k: e[k] for k in ("type", "loc", "input", "ctx") if k in e} for e in errors])
        out._step_settings = settings.model_dump(exclude_unset=True)  # those given; the rest keep their defaults
        return out

    @property
    def step_settings(self) -> dict:
        """The step settings the request set (each step reads its own: ``Step.settings``)."""
        return dict(self._step_settings)

    steps: int = Field(16, ge=1, le=MAX_STEPS,
                       description=f"Denoising steps K, 1..{MAX_STEPS} (one model call each; with `sampler: eb` "
                                   "the cap on steps). The last step unmasks everything left. Unset: 16, or a "
                                   "distilled checkpoint's own count.", examples=[8])
    ordering: Ordering = Field(
        "random", description="Which masked positions a step unmasks: predetermined (`random`, `left_to_right`, "
                              "`halton`: drawn jointly) or adaptive (`top_prob`, `margin`, `entropy`: see "
                              "`adaptive_path`). Ignored by `sampler: eb`, which ranks by `eb_proxy`.",
        examples=["random"])
    schedule: Schedule = Field(
        "loglinear", description="Tokens per step: `loglinear` (MDLM's, even counts), `linear` (linear noise) "
                                 "or `cosine` (MaskGIT's).")
    sampler: Sampler = Field(
        "fixed", description="`fixed`: counts from `schedule`; `eb`: EB-Sampler's adaptive counts; any other: a "
                             "sampler registered with the library (`ttcore.sampling.steps.register_step`).")
    eb_gamma: float = Field(0.5, ge=0, le=1e6, allow_inf_nan=False,
                            description="EB-Sampler entropy budget (finite, >= 0; 0 = one token per step). Used by "
                                        "`sampler: eb`.", examples=[0.5])
    eb_proxy: EBProxy = Field(
        "entropy", description="EB-Sampler's error proxy that ranks positions (lowest first): `entropy`, "
                               "`confidence` (minus the top probability) or `margin` (minus top-1 minus top-2).")
    contraction: Contraction = Field(
        "head", description="TT with a predetermined ordering: how masked positions outside this step's set "
                            "are summed out. `head`: the learned contracted-core head (the paper's fast path; "
                            "exact with respect to that head's Gbar, not to the cores); `exact`: the sum of "
                            "the cores themselves (exact with respect to the TT; all V x r x r outputs on "
                            "every masked position). At temperature != 1 both use the exact sum.")
    adaptive_path: Literal["fast", "exact"] = Field(
        SamplerConfig.adaptive_path,  # the library's default: one default everywhere
        description="Adaptive orderings and `sampler: eb` with a CP / TT checkpoint. `fast` (the default, as in the "
                    "library) chooses a step's positions from single-position marginals computed once per step "
                    "(cheaply: the heaviest head outputs of each position), then draws them jointly as a "
                    "predetermined step does (the draw is exact, the choice approximate; about the cost of a "
                    "random-order step); `exact`: the exact chain rule (Sec. 4.2), re-ranking after every pick (the "
                    "reference; full V x r x r outputs on every masked position, many times slower at text size). "
                    "No effect on predetermined orderings, `joint: false` or rank-1 checkpoints.")
    joint: bool = Field(True, strict=True,
                        description="`false`: the rank-1 view of a CP / TT checkpoint: each position drawn "
                                    "independently from its exact marginal under the joint the step would "
                                    "draw from (same network and `contraction`, no joint draw; fixed "
                                    "samplers only). It isolates what joint sampling buys.")
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False,
        description="Deadline in seconds from arrival (at most the server's `--max-timeout-s`, its default). Past "
                    "it the request ends: 504, or an `error` event with `code: timeout` when streaming. A request "
                    "whose estimated compute exceeds it is refused up front with a 422 naming the largest "
                    "`num_samples` that fits.", examples=[60])

    def to_sampler_config(self) -> SamplerConfig:
        """The request's sampler, frozen (as vLLM's ``to_sampling_params``); the seed and prompt are the run's.
        ``temperature`` is each request type's own field (OpenAI's allows 0, served as the minimum)."""
        temperature = max(self.temperature, MIN_TEMPERATURE)
        return SamplerConfig(ordering=self.ordering, schedule=self.schedule, temperature=temperature,
                             eb_proxy=self.eb_proxy, contraction=self.contraction, joint=self.joint,
                             adaptive_path=self.adaptive_path,
                             **self._step_settings,
                             **named_sampler(self.sampler, self.eb_gamma))


class ConstraintFields(BaseModel):
    """What a generation's output must be: a regular expression or a grammar (``POST /generate`` and the
    ``/v1`` completions take them; docs: structured output)."""
    model_config = ConfigDict(extra="forbid", strict=True)

    regex: str | None = Field(
        None, min_length=1, max_length=MAX_PATTERN,
        description="A regular expression (Python syntax, no look-around or back-references) the decoded text "
                    "must match whole: after a prefix prompt, the completion; with a template or no prompt, the "
                    "whole sequence. Every step draws from the model's joint restricted to the sequences the "
                    "expression accepts (exact, the other masked positions summed out), so every sample matches. "
                    f"At most {MAX_PATTERN} characters and {MAX_STATES} automaton states over the model's tokens.",
        examples=["[0-9]{4}-[0-9]{2}-[0-9]{2}"])
    grammar: Grammar | None = Field(
        None, description="A grammar the sequence must be in (`GET /models` lists each checkpoint's): `smiles`, "
                          "for molecule families: balanced, non-empty branches, paired ring closures, bonds "
                          "followed by atoms (what a regular language can check of SMILES: valences and "
                          "aromaticity it cannot).", examples=["smiles"])


class GenerateRequest(SamplerFields, ConstraintFields):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"model": "qm9", "decomposition": "tt", "num_samples": 4, "steps": 8, "ordering": "random", "seed": 0},
        {"model": "qm9", "num_samples": 2, "steps": 32, "sampler": "eb", "eb_gamma": 0.5, "stream": True},
        {"model": "qm9", "num_samples": 2, "steps": 8, "prompt": "c1ccccc1[MASK][MASK]", "ordering": "top_prob"},
        {"model": "qm9", "num_samples": 4, "steps": 4, "grammar": "smiles"},
    ]})

    model: str | None = Field(None, description="Model family, e.g. `qm9` or `text`. Default: the first loaded.",
                              examples=["qm9"], max_length=64)
    decomposition: Decomposition | None = Field(
        None, description="Joint distribution of the checkpoint: `none` (rank-1 MDM), `cp` or `tt`. "
                          "Default: the most expressive available (the most head outputs per masked position, "
                          "then the higher rank: TT r16 over CP r64 over none).", examples=["tt"])
    rank: int | None = Field(None, ge=1, le=1024, description="Rank of the checkpoint (with `decomposition`).",
                             examples=[8])
    checkpoint: str | None = Field(None, max_length=128, description="A checkpoint by name (`GET /models`), e.g. a "
                                   "distilled one beside its teacher; `model`, `decomposition` and `rank`, when "
                                   "given, must match it. Without it, among equally expressive checkpoints one "
                                   "distilled for at least `steps` is preferred.")
    num_samples: int = Field(4, ge=1, le=MAX_SAMPLES, description=f"Sequences to generate, 1..{MAX_SAMPLES}.",
                             examples=[4])
    temperature: float = Field(1.0, ge=MIN_TEMPERATURE, le=100, allow_inf_nan=False,
                               description=f"Temperature T, {MIN_TEMPERATURE}..100 (finite): samples from the joint of "
                                           "the tokens and the format's latent index (CP's component, TT's path of "
                                           "hidden states) to the power 1/T (rank 1: p(x)^(1/T)); as T -> 0 every "
                                           "draw is the tokens of the most likely (tokens, latent) pair "
                                           f"({MIN_TEMPERATURE}, the power 100, nearly always is, but not "
                                           "when the best pairs nearly tie: of two pairs 3% apart in probability, "
                                           "the runner-up is drawn about 5% of the time). Docs: concepts, temperature.",
                               examples=[1.0])
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="RNG seed, 0..2^53-1 (exact in JSON): the same "
                                                                  "seed gives the same output on the same device.",
                             examples=[0])
    prompt: str | None = Field(
        None, max_length=MAX_PROMPT_CHARS,
        description="A template: known tokens are kept, `[MASK]` placeholders are filled; a template shorter "
                    "than the model length is followed by masks (a prefix for text). SMILES templates may use "
                    "`[PAD]` to fix the end.", examples=["C1CC[MASK][MASK]1"])
    unique: bool = Field(False, strict=True,
                         description="Drop duplicate samples (SMILES: by RDKit canonical form; text: by text); the "
                                     "answer may then hold fewer than `num_samples`.")
    valid_only: bool = Field(False, strict=True,
                             description=f"SMILES models only: answer with valid molecules only, drawing further "
                                         f"rounds of `num_samples` (at most {MAX_VALID_ROUNDS} rounds in all) "
                                         f"until `num_samples` are found, within the request's deadline; "
                                         f"`drawn` says how many were drawn. "
                                         f"With a seed, round k uses seed + k * {ROUND_SEED_STRIDE} (mod 2^53).")
    step_tokens: bool = Field(False, strict=True,
                              description="Streaming: each `step` event also lists every sequence's tokens by "
                                          "position (`tokens`), so a client can show which ones a step committed.")
    stream: bool = Field(False, strict=True,
                         description="JSON `true` or `false` only. Stream server-sent events: one `step` event per "
                                     "denoising step, then `done` (or `error`).")

    @field_validator("prompt")
    @classmethod
    def _prompt_is_unicode(cls, value: str | None) -> str | None:
        return value if value is None else unicode_text(value, "prompt")


class Sample(BaseModel):
    text: str = Field(description="The generated sequence, padding stripped.", examples=["CC(=O)OC"])
    valid: bool | None = Field(None, description="Whether the sample passes its family's check (families whose "
                                                 "metrics check samples: `validates` in `GET /models`; molecules: "
                                                 "parses and sanitizes with RDKit, and its canonical SMILES "
                                                 "reads back); null for others.")
    canonical: str | None = Field(None, description="Molecule families: RDKit canonical form when valid.")
    qed: float | None = Field(None, description="Molecule families, valid: RDKit's QED drug-likeness (0..1); null "
                                                "where RDKit cannot compute it.")
    logp: float | None = Field(None, description="Molecule families, valid: Wildman-Crippen logP (RDKit).")
    mol_weight: float | None = Field(None, description="Molecule families, valid: average molecular weight in "
                                                       "g/mol (RDKit).")


class Timings(BaseModel):
    queue_ms: float = Field(description="From arrival to the first denoising step.")
    first_event_ms: float = Field(description="From arrival to the first step's event.")
    total_ms: float = Field(description="From arrival to the final sequences.")
    forward_ms: float = Field(0.0, description="This request's share of the backbone passes it took part in (a "
                                               "batched pass split by sequences: an apportioned figure).")
    sampling_ms: float = Field(0.0, description="Its share of the rest of those steps (heads, joint draws), split "
                                                "the same way.")
    decode_ms: float = Field(0.0, description="Decoding its sequences to text (every step when streaming; the "
                                              "final sequences otherwise) and checking SMILES.")


class Telemetry(BaseModel):
    """What a finished request took (``/v1`` answers carry it as their ``ttcore`` extension)."""
    checkpoint: str = Field(description="Name (directory) of the checkpoint that answered.")
    steps: int = Field(description="Denoising steps taken.")
    model_calls: int = Field(description="Backbone forward passes this request took part in.")
    tokens_per_step: list[int] = Field(description="Tokens committed in each step (all sequences together).")
    timings: Timings


class GenerateResponse(BaseModel):
    id: str
    model: str = Field(description="Family of the checkpoint that answered.")
    checkpoint: str = Field(description="Name (directory) of the checkpoint that answered.")
    decomposition: str
    rank: int
    samples: list[Sample]
    steps: int = Field(description="Denoising steps taken (all rounds).")
    model_calls: int = Field(description="Backbone forward passes this request took part in (all rounds).")
    tokens_per_step: list[int] = Field(default_factory=list, description="Tokens committed in each step (all "
                                                                         "sequences together; rounds in turn).")
    drawn: int = Field(description="Sequences drawn (all rounds); more than `samples` when `unique` or "
                                   "`valid_only` dropped some.")
    rounds: int = Field(1, description="Rounds of `num_samples` draws (more than 1 only with `valid_only`).")
    stopped_early: Literal["deadline", "busy"] | None = Field(
        None, description="`valid_only`: why the rounds stopped before enough valid molecules were found "
        "(`deadline`: the request's deadline passed, or what was left of it could not fit another round; `busy`: "
        "the server could not admit another round); `samples` then holds what the finished rounds found, fewer "
        f"than `num_samples`. `null` when the rounds ended normally (enough found, or {MAX_VALID_ROUNDS} rounds). "
        "A request whose first round does not finish gets 504.")
    timings: Timings = Field(description="Of the last round (each round is admitted and queued on its own).")


class StepEvent(BaseModel):
    id: str = Field(description="The request's id (as in the final answer and any error event).")
    round: int = Field(0, description="`valid_only`: the round of draws (0 first); each round starts from masks.")
    step: int
    sequences: list[str] = Field(description="Partial sequences, masks shown as `[MASK]`.")
    committed: list[list[int]] = Field(description="Positions unmasked in this step, per sequence. They keep "
                                                   "their tokens for the rest of the round: no step remasks (a "
                                                   "block checkpoint's committed block is final).")
    tokens: list[list[str]] | None = Field(None, description="With `step_tokens`: each sequence's token text by "
                                                             "position (`[MASK]` for masks, `\"\"` for padding).")
