"""OpenAI-compatible front end over the same serving layer: ``GET /v1/models``, ``POST /v1/completions``.

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
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from ttcore.decompositions import DECOMPOSITIONS

from .admission import TooLarge
from .engine import EngineError, Overloaded
from .openai_schema import Completion, CompletionChoice, CompletionRequest, OpenAIModel, OpenAIModelList, Usage
from .registry import LoadedModel, ModelNotFound, PromptError
from .schema import MIN_TEMPERATURE, GenerateRequest, SamplerFields
from .security import clip
from .serving import Serving, Unsupported
from .statuses import failure_status


def _model_id_pattern() -> re.Pattern:
    """family-decomposition-rRANK, the decomposition one of the registry's (read at each request, so a
    format registered later is known)."""
    names = "|".join(map(re.escape, DECOMPOSITIONS))
    return re.compile(rf"^(?P<family>.+)-(?P<decomposition>{names})-r(?P<rank>\d+)$")
MASK = "[MASK]"


def model_id(lm: LoadedModel) -> str:
    return f"{lm.family}-{lm.info.decomposition}-r{lm.info.rank}"


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    """OpenAI's error object (a message quoting the client's input is cut to 200 characters, a param to 64)."""
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": clip(message), "type": kind,
                                           "param": None if param is None else clip(param, 64), "code": code}})


def _generate_request(req: CompletionRequest) -> GenerateRequest:
    m = _model_id_pattern().match(req.model)
    family, decomposition, rank = (m["family"], m["decomposition"], int(m["rank"])) if m else (req.model, None, None)
    sampler = {name: getattr(req, name) for name in SamplerFields.model_fields}  # the shared fields, as sent
    return GenerateRequest(model=family, decomposition=decomposition, rank=rank, num_samples=req.n,
                           temperature=max(req.temperature, MIN_TEMPERATURE), seed=req.seed,
                           prompt=req.prompt or None, **sampler)


class _Choice:
    """One completion: which canvas positions it covers, and what it has streamed so far."""

    def __init__(self, tok, start: int, max_tokens: int | None):
        self.tok, self.start, self.max_tokens = tok, start, max_tokens
        self.emitted, self.finished = "", False

    def completion(self, row: list[int], final: bool) -> tuple[list[int], str | None]:
        """The completion's token ids: its committed leading run (all of it when ``final``), cut at the
        first end token or max_tokens. -> (ids, finish reason or None while it can still grow)."""
        tok, out = self.tok, []
        for t in row[self.start:]:
            if t == tok.mask_id and not final:
                return out, None
            if t == tok.pad_id:
                return out, "stop"
            if self.max_tokens is not None and len(out) == self.max_tokens:
                return out, "length"
            out.append(t)
        return out, "length"

    def delta(self, row: list[int], final: bool) -> tuple[str, str | None]:
        """New text of the contiguous committed prefix (a trailing undecodable byte waits for the next)."""
        ids, reason = self.completion(row, final)
        text = self.tok.decode(ids)
        if reason is None:
            text = text.rstrip("\ufffd")
        if not text.startswith(self.emitted):
            return "", reason  # never un-say a delta: wait until the text extends what was sent
        new, self.emitted = text[len(self.emitted):], text
        return new, reason


def openai_router(serving: Serving) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])
    registry = serving.registry

    @router.get("/models", response_model=OpenAIModelList)
    async def models():
        return OpenAIModelList(data=[OpenAIModel(id=model_id(lm), ttcore={
            "checkpoint": lm.name, "family": lm.family, "decomposition": lm.info.decomposition, "rank": lm.info.rank,
            "length": lm.info.length, "domain": lm.domain, "metrics": lm.info.metrics}) for lm in registry.models])

    @router.post("/completions", response_model=Completion, responses={
        200: {"description": "A completion; with `stream: true`, `data: {chunk}` events then `data: [DONE]`",
              "content": {"text/event-stream": {"schema": {
                  "type": "object", "required": ["data"],
                  "properties": {"data": {"type": "string", "description": "a Completion chunk (JSON) or [DONE]"}}}}}},
        400: {"description": "Invalid request (OpenAI error object)"}, 401: {"description": "Missing or bad key"},
        404: {"description": "Unknown model"}, 413: {"description": "Body too large"},
        422: {"description": "Invalid request (OpenAI error object)"},
        503: {"description": "Overloaded (Retry-After)"}, 504: {"description": "Deadline passed"}})
    async def completions(req: CompletionRequest, request: Request):
        try:
            gen = _generate_request(req)
            # everything that can refuse the request happens before it is admitted: a failure after
            # admission would hold a slot (and run the job) with no reader
            lm = registry.resolve(gen.model, gen.decomposition, gen.rank)
            tok = lm.tokenizer
            template = MASK in req.prompt
            ids = registry.encode_prompt(lm, req.prompt).tolist() if req.prompt else []
            start = 0 if template or not req.prompt else len(tok.tokenize(req.prompt, allow_mask=True))
            job = serving.submit(gen)
        except ValidationError as e:
            err = e.errors()[0]
            return openai_error(400, f"{'.'.join(map(str, err['loc']))}: {err['msg']}", str(err["loc"][-1]))
        except ModelNotFound as e:
            return openai_error(404, str(e), "model", "model_not_found")
        except PromptError as e:
            return openai_error(400, str(e), "prompt")
        except (TooLarge, Unsupported) as e:
            return openai_error(400, str(e), {"num_samples": "n"}.get(e.field, e.field))
        except Overloaded as e:
            return openai_error(503, str(e), code="overloaded", kind="server_error",
                                headers={"Retry-After": str(e.retry_after_s)})
        try:
            return await _answer(req, request, job, tok, template, ids, start)
        except BaseException:  # a bug here must not leave the admitted job running without a reader
            serving.abort(job)
            raise

    async def _complete(job, tok, choices, prefix, cid, name, usage):
        async for out in serving.outputs(job):
            if isinstance(out, EngineError):
                return openai_error(failure_status(out.kind), out.message, code=out.kind, kind="server_error")
            if out.finished:
                rows, t0 = out.tokens.tolist(), time.perf_counter()
                made = []
                for i, (c, row) in enumerate(zip(choices, rows)):
                    ids_i, reason = c.completion(row, True)
                    made.append(CompletionChoice(text=prefix + tok.decode(ids_i), index=i, finish_reason=reason))
                job.decode_s += time.perf_counter() - t0
                answer = serving.answer_telemetry(job, out)
                return Completion(id=cid, model=name, choices=made, usage=usage(rows), ttcore=answer)

    async def _answer(req: CompletionRequest, request: Request, job, tok, template: bool, ids: list[int],
                      start: int):
        lm = job.lm
        prompt_tokens = sum(t not in (tok.mask_id, tok.pad_id) for t in ids[:tok.length])
        choices = [_Choice(tok, start, req.max_tokens) for _ in range(req.n)]
        prefix = req.prompt if req.echo and not template else ""
        cid, name = f"cmpl-{job.id}", model_id(lm)

        def usage(final_rows) -> Usage:
            done = sum(len(c.completion(row, True)[0]) for c, row in zip(choices, final_rows))
            return Usage(prompt_tokens=prompt_tokens, completion_tokens=done, total_tokens=prompt_tokens + done)

        if not req.stream:
            watcher = asyncio.create_task(serving.cancel_when(request.is_disconnected, job))
            try:
                return await _complete(job, tok, choices, prefix, cid, name, usage)
            finally:
                watcher.cancel()

        include_usage = bool((req.stream_options or {}).get("include_usage"))

        async def stream():
            first = True
            async for out in serving.outputs(job):
                if isinstance(out, EngineError):
                    err = {"message": out.message, "type": "server_error", "param": None, "code": out.kind}
                    yield f"data: {json.dumps({'error': err})}\n\n".encode()
                    break
                rows, t0 = out.tokens.tolist(), time.perf_counter()
                for i, (c, row) in enumerate(zip(choices, rows)):
                    if c.finished:
                        continue
                    text, reason = c.delta(row, out.finished)
                    c.finished = reason is not None
                    chunk = Completion(id=cid, model=name, choices=[CompletionChoice(
                        text=(prefix if first else "") + text, index=i, finish_reason=reason)],
                        ttcore={"step": out.step, "canvas": tok.decode(row), "committed": out.committed[i]})
                    yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n".encode()
                first = False
                job.decode_s += time.perf_counter() - t0
                if out.finished:
                    serving.answer_telemetry(job, out)
                    if include_usage:
                        last = Completion(id=cid, model=name, choices=[], usage=usage(rows))
                        yield f"data: {last.model_dump_json(exclude_none=True)}\n\n".encode()
                    break
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return router
