"""The OpenAI-compatible wire types (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``), following
OpenAI's Completions and Chat Completions APIs; diffusion settings are extra fields (OpenAI clients pass them as
``extra_body``)."""

import time
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, field_validator

from ttcore.tokenizers.symbols import MASK

from .schema import (
    MAX_PROMPT_CHARS,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_STEPS,
    MIN_TEMPERATURE,
    ConstraintFields,
    SamplerFields,
    Telemetry,
)


def _only_false(value: bool) -> bool:
    if value:
        raise ValueError("only false is supported")
    return value


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: only plain text (structured output is ``regex`` / ``grammar``)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]


class _OpenAIRequest(SamplerFields, ConstraintFields):
    """What OpenAI's Completions and Chat Completions requests share; the sampler's fields (``SamplerFields``)
    and the constraint's (``ConstraintFields``: ``regex``, ``grammar``) are extensions (``extra_body``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="A model id from /v1/models (`family-decomposition-rRANK`, e.g. `qm9-tt-r16`), "
                                   "or a family (`qm9`, `text`) for its best checkpoint.", max_length=64)
    max_tokens: int | None = Field(None, ge=1, le=MAX_STEPS,
                                   description="The most completion tokens returned (the model fills its fixed "
                                               "length; the completion is cut here, finish_reason `length`).")
    n: int = Field(1, ge=1, le=MAX_SAMPLES, description="Completions to generate.")
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False,
                               description=f"0..2; 0 is served as {MIN_TEMPERATURE}: the joint to the power 100, "
                                           "nearly always its most likely (tokens, latent) pair, not argmax: "
                                           "two nearly tied pairs are both drawn.")
    top_p: float = Field(1.0, ge=1, le=1, description="Only 1 (nucleus sampling does not apply to joint draws).")
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stream: bool = Field(False, strict=True)
    stream_options: dict | None = Field(None, description="`{\"include_usage\": true}` adds a final usage chunk.")
    stop: None = Field(None, description="Not supported (null only).")
    user: str | None = Field(None, max_length=256)
    # extensions OpenAI-compatible clients and benchmark tools commonly send (vLLM's): honoured where they mean
    # something for a fixed-length diffusion sample, else accepted at their neutral value only
    ignore_eos: bool = Field(False, strict=True, description="The completion is not cut at an end token: it runs "
                                                             "to max_tokens or the model's length (end tokens "
                                                             "skipped).")
    min_tokens: int = Field(0, ge=0, le=MAX_STEPS, description="An end token before this many completion tokens "
                                                               "does not end the completion (it is skipped).")
    best_of: int | None = Field(None, ge=1, le=1, description="Only 1.")
    presence_penalty: float = Field(0.0, ge=0, le=0, description="Only 0 (no penalties on joint draws).")
    frequency_penalty: float = Field(0.0, ge=0, le=0, description="Only 0 (no penalties on joint draws).")
    repetition_penalty: float = Field(1.0, ge=1, le=1, description="Only 1 (no penalties on joint draws).")
    top_k: int = Field(-1, ge=-1, le=0, description="Only -1 or 0 (off): every token is drawn from the joint.")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="Only null or {}.")
    # what OpenAI's SDKs send at their neutral values (a client's extras at their defaults are accepted)
    response_format: ResponseFormat | None = Field(None, description='Only {"type": "text"} (or null).')
    tools: list | None = Field(None, max_length=0, description="Only null or [] (these models call no tools).")
    tool_choice: Literal["none"] | None = Field(None, description='Only "none" (or null).')
    parallel_tool_calls: bool | None = Field(None, description="Accepted (no tools are called).")
    store: Annotated[StrictBool, AfterValidator(_only_false)] | None = Field(
        None, description="Only false or null (nothing is stored).")
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16, description="Accepted and ignored (at most 16 pairs).")

    @property
    def completion_limit(self) -> int | None:
        """The most completion tokens asked for."""
        return self.max_tokens


class CompletionRequest(_OpenAIRequest):
    """OpenAI's Completions request."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"model": "qm9-tt-r16", "prompt": "C1CC", "n": 4, "steps": 8, "seed": 0},
        {"model": "text", "prompt": "The Congress", "max_tokens": 32, "stream": True, "steps": 16},
    ]})

    prompt: str = Field("", max_length=MAX_PROMPT_CHARS,
                        description="A prefix to continue, or a template with `[MASK]` placeholders to fill "
                                    "(then the completion is the whole filled sequence).")
    echo: bool = Field(False, strict=True, description="Return the prompt before the completion.")
    suffix: None = Field(None, description="Not supported (null only).")
    logprobs: None = Field(None, description="Not supported (null only); see POST /score for exact log-probabilities.")


NO_MASK = {"not": {"pattern": r"\[MASK\]"}}  # the schema says what ``ChatMessage`` refuses: no [MASK] in a text


class TextPart(BaseModel):
    """A message's text part (OpenAI's content parts; only text applies to these models)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str = Field(max_length=MAX_PROMPT_CHARS, json_schema_extra=NO_MASK)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] = Field(max_length=MAX_PROMPT_CHARS, json_schema_extra=NO_MASK)
    name: str | None = Field(None, max_length=64)

    @field_validator("content")
    @classmethod
    def _literal_unicode(cls, value):
        text = value if isinstance(value, str) else "".join(p.text for p in value)  # the parts as the prompt joins them
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
        if MASK in text:  # a prompt with it is a template, whose answer is the whole sequence, system text too
            raise ValueError(f"a message may not hold {MASK}: message contents are literal text, and {MASK} "
                             "is the models' placeholder (use /v1/completions or /generate with a template)")
        return value

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_OpenAIRequest):
    """OpenAI's Chat Completions request: the messages are written into the model's prompt by its family's chat
    template (``service.chat``); a family without one is refused (400, param ``model``)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"model": "text", "messages": [{"role": "user", "content": "The Congress"}], "max_tokens": 32,
         "steps": 16},
    ]})

    messages: list[ChatMessage] = Field(min_length=1, max_length=64)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_STEPS,
                                              description="As max_tokens (OpenAI's newer name); the smaller wins.")
    logprobs: Annotated[StrictBool, AfterValidator(_only_false)] = Field(
        False, json_schema_extra={"const": False},
        description="Only false; see POST /score for exact log-probabilities.")
    top_logprobs: int | None = Field(None, ge=0, le=0, description="Only 0 or null (see POST /score).")

    @property
    def completion_limit(self) -> int | None:
        limits = [m for m in (self.max_tokens, self.max_completion_tokens) if m is not None]
        return min(limits) if limits else None


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class StepTelemetry(BaseModel):
    """A stream chunk's extension: where its choice stands after the step."""
    step: int
    canvas: str = Field(description="The choice's provisional sequence, masks shown as `[MASK]`.")
    committed: list[int] = Field(description="Positions committed in this step (final: no step remasks).")


class ModelTelemetry(BaseModel):
    """A model's extension in ``/v1/models``."""
    checkpoint: str
    family: str
    decomposition: str
    rank: int
    length: int
    domain: str = Field(description="The tokenizer's kind: `smiles`, `char`, `text` (BPE), ...")
    metrics: str = Field(description="What its family is measured by (`ttcore.metrics.kinds`).")


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    ttcore: Telemetry | StepTelemetry | None = Field(
        None, description="Extension: steps, model calls, timings; in stream chunks the step, the provisional "
                          "canvas (masks shown) and the positions committed in that step.")


class ChatReply(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class _ChatChoiceBase(BaseModel):
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class ChatChoice(_ChatChoiceBase):
    message: ChatReply


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_ChatChoiceBase):
    delta: ChatDelta


class _ChatAnswer(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    usage: Usage | None = None
    ttcore: Telemetry | StepTelemetry | None = Field(None, description="Extension: as in Completion.")


class ChatCompletion(_ChatAnswer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ChatCompletionChunk(_ChatAnswer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "ttcore"
    ttcore: ModelTelemetry = Field(description="Extension: the checkpoint behind the id.")


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]
