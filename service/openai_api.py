"""OpenAI-compatible front end over the same serving layer: ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (the conversation written into the prompt by the family's chat template:
``service.chat``; the reply is that prompt's completion).

Completion text: for a prefix prompt, the tokens after it, up to the sequence's first end token
([PAD] / end-of-text: finish_reason ``stop``) or ``max_tokens`` / the model length (``length``); for a
template with ``[MASK]``, the whole filled sequence. ``echo`` prepends the prompt.

Streaming rule: diffusion commits tokens out of order, and an OpenAI client concatenates the ``text``
deltas, so each chunk's delta is the newly committed *contiguous prefix* of the completion: after a step
the completion's leading run of committed tokens grows, and the delta is the text it added (concatenating
every delta gives exactly the final text). Each chunk also carries ``ttcore``: the step, the provisional
canvas with ``[MASK]`` where still masked, and the positions committed in that step. A choice's last
chunk has its ``finish_reason``; with ``stream_options.include_usage`` a final chunk with empty
``choices`` carries ``usage``; then ``data: [DONE]``.
"""

import asyncio
import json
import re

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ttcore.decompositions import DECOMPOSITIONS
from ttcore.tokenizers.symbols import MASK

from . import error_docs
from .admission import StreamBudget
from .chat import chat_template
from .completions import completion_prompt
from .completions import completions as completion_steps
from .openai_schema import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatReply,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelTelemetry,
    OpenAIModel,
    OpenAIModelList,
    StepTelemetry,
    Usage,
)
from .refusals import Refusal, Unsupported, failure_status
from .registry import LoadedModel
from .routes import current_serving
from .schema import MAX_PROMPT_CHARS, MIN_TEMPERATURE, ConstraintFields, GenerateRequest, SamplerFields
from .security import clip
from .serving import Failure, Serving


def _model_id_pattern() -> re.Pattern:
    """family-decomposition-rRANK, the decomposition one of the registry's (read at each request, so a
    format registered later is known)."""
    names = "|".join(map(re.escape, DECOMPOSITIONS))
    return re.compile(rf"^(?P<family>.+)-(?P<decomposition>{names})-r(?P<rank>\d+)$")
def model_id(lm: LoadedModel) -> str:
    """The checkpoint's /v1 id, as its kind names it: family-decomposition-rRANK; an autoregressive one family-ar."""
    return lm.kind.model_id(lm.family, lm.model.cfg)


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None, whole: bool = False) -> JSONResponse:
    """OpenAI's error object (a message quoting the client's input is cut to 200 characters, unless ``whole``:
    the server's own text, its quotes of the input cut already; a param to 64)."""
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": message if whole else clip(message), "type": kind,
                                           "param": None if param is None else clip(param, 64), "code": code}})


def _generate_request(req, prompt: str, checkpoints=(), named_ids: dict | None = None) -> GenerateRequest:
    """The generation request of an OpenAI request: ``model`` a loaded checkpoint's name (one of
    ``checkpoints``), a model id (family-decomposition-rRANK, or family-ar: a key of ``named_ids``, which names
    its checkpoint) or a family."""
    m = _model_id_pattern().match(req.model)
    family, decomposition, rank = (m["family"], m["decomposition"], int(m["rank"])) if m else (req.model, None, None)
    checkpoint = req.model if req.model in checkpoints else (named_ids or {}).get(req.model)
    if checkpoint is not None:
        family, decomposition, rank = None, None, None
    # the shared fields the client set (unset ones keep their defaults: a distilled checkpoint's own steps)
    sampler = {name: getattr(req, name) for name in (*SamplerFields.model_fields, *ConstraintFields.model_fields)
               if name in req.model_fields_set} | req.step_settings
    return GenerateRequest(model=family, decomposition=decomposition, rank=rank, checkpoint=checkpoint,
                           num_samples=req.n,
                           temperature=max(req.temperature, MIN_TEMPERATURE), seed=req.seed,
                           prompt=prompt or None, stream=req.stream, **sampler)  # a stream is estimated


def _named_ids(serving: Serving) -> dict:
    """The model ids of kinds answered only when named (``ModelKind.by_default`` false: family-ar) -> the
    checkpoint each names (the first by name)."""
    ids = {}
    for lm in serving.registry.models:
        if not lm.kind.by_default:  # named by its own id: the first checkpoint of that id
            ids.setdefault(model_id(lm), lm.name)
    return ids


def openai_refused(r: Refusal) -> JSONResponse:
    """A refusal as OpenAI's error object: 422 becomes 400 (OpenAI's invalid request), ``num_samples`` is ``n``."""
    param = {"num_samples": "n"}.get(r.loc[0], r.loc[0]) if r.loc else None
    kind = "server_error" if r.status >= 500 else "invalid_request_error"
    return openai_error(400 if r.status == 422 else r.status, r.message, param, r.code, kind, headers=r.headers or None,
                        whole=r.status == 404)  # the checkpoints available, all of them


router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])


@router.get("/models", response_model=OpenAIModelList)
async def models(serving: Serving = Depends(current_serving)):
    return OpenAIModelList(data=[OpenAIModel(id=model_id(lm), ttcore=ModelTelemetry(
        checkpoint=lm.name, family=lm.family, decomposition=lm.info.decomposition, rank=lm.info.rank,
        length=lm.info.length, domain=lm.domain, metrics=lm.info.metrics)) for lm in serving.registry.models])


@router.post("/completions", response_model=Completion, responses=error_docs.openai({
    200: {"description": "A completion; with `stream: true`, `data: {chunk}` events then `data: [DONE]`",
          "content": {"text/event-stream": {"schema": {
              "type": "object", "required": ["data"],
              "properties": {"data": {"type": "string", "description": "a Completion chunk (JSON) or [DONE]"}}}}}},
    400: "Invalid request (OpenAI error object)", 401: "Missing or bad key",
    404: "Unknown model", 413: "Body too large",
    422: "Invalid request (OpenAI error object)",
    503: "Overloaded (Retry-After)", 504: "Deadline passed"}))
async def completions(req: CompletionRequest, request: Request, serving: Serving = Depends(current_serving)):
    return await _serve(serving, req, request, req.prompt, _TextShape(req))


@router.post("/chat/completions", response_model=ChatCompletion, responses=error_docs.openai({
    200: {"description": "A chat completion; with `stream: true`, `data: {chunk}` events then `data: [DONE]`",
          "content": {"text/event-stream": {"schema": {
              "type": "object", "required": ["data"],
              "properties": {"data": {"type": "string", "description": "a ChatCompletionChunk (JSON) or [DONE]"}}}}}},
    400: "Invalid request, or a model without a chat template (OpenAI error object)",
    401: "Missing or bad key", 404: "Unknown model",
    413: "Body too large", 422: "Invalid request (OpenAI error object)",
    503: "Overloaded (Retry-After)", 504: "Deadline passed"}))
async def chat_completions(req: ChatCompletionRequest, request: Request, serving: Serving = Depends(current_serving)):
    """The conversation written into the prompt by the family's chat template (``service.chat``); the reply is
    the completion of that prompt, as ``/v1/completions`` makes it."""
    gen = _generate_request(req, "", {lm.name for lm in serving.registry.models}, _named_ids(serving))
    lm = serving.resolve(gen)
    template = chat_template(lm.domain)
    if template is None:
        raise Unsupported("model", f"{model_id(lm)} has no chat template: its family ({lm.family}) generates "
                                   f"{lm.domain} sequences, not replies to messages; use /v1/completions")
    prompt = template(req.messages)
    if MASK in prompt:  # each message was checked (``ChatMessage``); the template's joins must not make one either
        raise Unsupported("messages", f"the messages make a prompt that holds {MASK}: message contents are literal")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise Unsupported("messages", f"the messages make a prompt of {len(prompt)} characters, above "
                                      f"{MAX_PROMPT_CHARS}")
    return await _serve(serving, req, request, prompt, _ChatShape())


async def _serve(serving: Serving, req, request: Request, text: str, shape):
    """A completion of ``text`` answered in ``shape`` (Completions or Chat Completions), whole or streamed."""
    gen = _generate_request(req, text, {lm.name for lm in serving.registry.models}, _named_ids(serving))
    # everything that can refuse the request happens before it is admitted: a failure after admission would hold
    # a slot (and run the job) with no reader; a refusal is answered by the app's handler (``openai_refused``)
    lm = serving.resolve(gen)
    prompt = completion_prompt(serving, lm, text)
    room = lm.model.cfg.dit.length - prompt.start
    if (req.regex is not None or req.grammar is not None) and req.max_tokens is not None and req.max_tokens < room:
        field = "regex" if req.regex is not None else "grammar"
        raise Unsupported("max_tokens", f"with {field}, the whole completion ({room} tokens after this prompt) is "
                                        f"what matches; a max_tokens cut would return part of it: leave max_tokens "
                                        f"unset or at least {room}")
    job = await serving.admit(gen)
    try:
        if req.stream:
            return StreamingResponse(_chunks(serving, req, job, prompt, shape), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _answer(serving, req, request, job, prompt, shape)
    except BaseException:  # a bug here must not leave the admitted job running without a reader
        serving.abort(job)
        raise


def _min_tokens(req) -> float:
    """Where an end token may end the completion: never with ``ignore_eos``, else from ``min_tokens`` on."""
    return float("inf") if req.ignore_eos else req.min_tokens


def _usage(prompt, step) -> Usage:
    return Usage(prompt_tokens=prompt.tokens, completion_tokens=step.completion_tokens,
                 total_tokens=prompt.tokens + step.completion_tokens)


class _TextShape:
    """The Completions API's objects (``echo``: the prompt before the first text of each choice)."""

    def __init__(self, req: CompletionRequest):
        self.prefix = req.prompt if req.echo else ""

    def answer(self, job, step, usage: Usage, template: bool):
        prefix = "" if template else self.prefix
        return Completion(id=f"cmpl-{job.id}", model=model_id(job.lm), usage=usage, ttcore=step.telemetry,
                          choices=[CompletionChoice(text=prefix + text, index=i, finish_reason=reason)
                                   for i, (text, reason) in enumerate(step.final)])

    def chunk(self, job, i: int, text: str, reason, first: bool, template: bool, ttcore: StepTelemetry):
        prefix = self.prefix if first and not template else ""
        return Completion(id=f"cmpl-{job.id}", model=model_id(job.lm), ttcore=ttcore,
                          choices=[CompletionChoice(text=prefix + text, index=i, finish_reason=reason)])

    def usage_chunk(self, job, usage: Usage):
        return Completion(id=f"cmpl-{job.id}", model=model_id(job.lm), choices=[], usage=usage)


class _ChatShape:
    """The Chat Completions API's objects (a choice's first chunk says the role)."""

    def answer(self, job, step, usage: Usage, template: bool):
        return ChatCompletion(id=f"chatcmpl-{job.id}", model=model_id(job.lm), usage=usage, ttcore=step.telemetry,
                              choices=[ChatChoice(index=i, message=ChatReply(content=text), finish_reason=reason)
                                       for i, (text, reason) in enumerate(step.final)])

    def chunk(self, job, i: int, text: str, reason, first: bool, template: bool, ttcore: StepTelemetry):
        delta = ChatDelta(role="assistant" if first else None, content=text)
        return ChatCompletionChunk(id=f"chatcmpl-{job.id}", model=model_id(job.lm), ttcore=ttcore,
                                   choices=[ChatChunkChoice(index=i, delta=delta, finish_reason=reason)])

    def usage_chunk(self, job, usage: Usage):
        return ChatCompletionChunk(id=f"chatcmpl-{job.id}", model=model_id(job.lm), choices=[], usage=usage)


async def _answer(serving: Serving, req, request: Request, job, prompt, shape):
    """The whole completion as one OpenAI object (the job is cancelled when its client goes away)."""
    watcher = asyncio.create_task(serving.cancel_when(request.is_disconnected, job))
    try:
        async for step in completion_steps(serving, job, prompt, req.n, req.completion_limit, stream=False,
                                           min_tokens=_min_tokens(req)):
            if isinstance(step, Failure):
                return openai_error(failure_status(step.kind), step.message, code=step.kind, kind="server_error")
            return shape.answer(job, step, _usage(prompt, step), prompt.template)
    finally:
        watcher.cancel()


async def _chunks(serving: Serving, req, job, prompt, shape):
    """The completion as OpenAI's stream: a chunk per choice per step (the streaming rule above), the usage
    chunk when asked, then ``[DONE]``."""
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    first, budget = True, StreamBudget(serving.max_stream_bytes)
    steps = completion_steps(serving, job, prompt, req.n, req.completion_limit, stream=True,
                             min_tokens=_min_tokens(req))

    def error(message: str, code: str) -> bytes:
        body = {"message": message, "type": "server_error", "param": None, "code": code}
        return f"data: {json.dumps({'error': body})}\n\n".encode()

    async for step in steps:
        if isinstance(step, Failure):
            yield error(step.message, step.kind)
            break
        chunks = [shape.chunk(job, i, text, reason, first, prompt.template,
                              StepTelemetry(step=step.step, canvas=step.canvases[i], committed=step.committed[i]))
                  for i, text, reason in step.deltas]
        if step.final is not None and include_usage:
            chunks.append(shape.usage_chunk(job, _usage(prompt, step)))
        data = b"".join(f"data: {c.model_dump_json(exclude_none=True)}\n\n".encode() for c in chunks)
        if not budget.allows(data, reserve=1024):  # the limit holds whatever admission estimated
            await steps.aclose()
            serving.abort(job)
            yield error(budget.message(), "stream_limit")
            break
        yield data
        first = False
    yield b"data: [DONE]\n\n"
