"""The native API's routes, at module level (``create_app`` includes them): generation, scoring, the model list
and cards, depictions, the playground page, health and metrics. Each asks the app's ``Serving``
(``current_serving``); a refusal is raised, never caught here: the app's one handler answers it
(``service.app``)."""

import asyncio
import dataclasses
import json
import time
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse

from ttcore.sampling.steps import WorkKind

from . import error_docs, scores
from .admission import StreamBudget
from .error_docs import StatusAnswer
from .models_schema import ModelInfo, ModelList
from .refusals import failure_status
from .registry import LoadedModel
from .schema import GenerateRequest, GenerateResponse, StepEvent
from .score_schema import ScoreRequest, ScoreResponse
from .serving import Failure, Serving
from .serving import depict as depict_smiles
from .speed import Speed

MAX_DEPICT_CHARS = 256
SMILES_CHARACTERS = r"^[!-~]+$"  # printable ASCII without whitespace: SMILES's alphabet and more
MIN_DEPICT_PX, MAX_DEPICT_PX = 64, 1024
PLAYGROUND = Path(__file__).resolve().parent / "playground"  # the page at / (static files, no build step)

router = APIRouter()


def current_serving(request: Request) -> Serving:
    """The ``Serving`` the app was built over (``create_app``)."""
    return request.app.state.serving


def _sse(item: StepEvent | GenerateResponse | Failure) -> bytes:
    """One server-sent event: ``step``, ``done`` (the answer) or ``error``."""
    if isinstance(item, Failure):
        event, payload = "error", item.payload()
    else:
        event, payload = ("step" if isinstance(item, StepEvent) else "done"), item.model_dump()
    return f"event: {event}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


STREAM_CLOSING_BYTES = 1024  # what a stream keeps back for the error event that ends it at its byte limit
SSE_EVENT = {"type": "object", "required": ["event", "data"], "properties": {
    "event": {"type": "string", "enum": ["step", "done", "error"]},
    "data": {"type": "string", "description": "JSON: a StepEvent, a GenerateResponse or {id, error, code}"}}}
GENERATE_RESPONSES = error_docs.native({
    200: {"description": "The samples (JSON); with `stream: true` a server-sent-event stream instead: `event: step` "
                         "per denoising step (StepEvent), then `event: done` (the JSON answer) or `event: error` "
                         "(`{id, error, code}`, code `timeout`, `failed`, `cancelled`, `stream_limit` (the stream "
                         "reached `--max-stream-mb`), or under Ray Serve `replica_failed`); every event carries "
                         "the request's `id`",
          "content": {"text/event-stream": {"schema": SSE_EVENT}}},
    400: "The body is not JSON",
    401: "Missing or unknown API key (when keys are configured)",
    404: "No loaded checkpoint matches; the answer names what is available",
    413: "The body is larger than the server's limit",
    422: "Invalid input, or more compute or memory than the server's limits: the field and the rule (for limits, "
         "the largest value that fits)",
    500: "A denoising step failed",
    503: "Overloaded; retry after the Retry-After header (seconds until a slot frees, estimated)",
    504: "The request's deadline (`timeout_s`, or the server's maximum) passed",
})




@router.post("/generate", response_model=GenerateResponse, responses=GENERATE_RESPONSES)
async def generate(req: GenerateRequest, request: Request, serving: Serving = Depends(current_serving)):
    job = await serving.admit(req)
    start = time.perf_counter()
    if req.stream:
        async def stream():
            budget, events = StreamBudget(serving.max_stream_bytes), serving.events(job, request=req)
            async for item in events:
                data = _sse(item)
                if not budget.allows(data, reserve=STREAM_CLOSING_BYTES):  # the limit holds whatever was estimated
                    await events.aclose()  # cancels the job
                    yield _sse(Failure(job.id, "stream_limit", budget.message()))
                    return
                yield data
                if isinstance(item, GenerateResponse):
                    serving.metrics.latency.labels("/generate").observe(time.perf_counter() - start)
        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    watcher = asyncio.create_task(serving.cancel_when(request.is_disconnected, job))
    try:
        async for item in serving.events(job, steps=False, request=req):
            if isinstance(item, GenerateResponse):
                return JSONResponse(item.model_dump())
            if isinstance(item, Failure):
                return JSONResponse(status_code=failure_status(item.kind), content={"detail": item.message})
    finally:
        watcher.cancel()


@router.post("/score", response_model=ScoreResponse, responses=error_docs.native({
    400: "The body is not JSON", 401: "Missing or unknown API key",
    404: "No loaded checkpoint matches", 413: "Body too large",
    422: "Invalid input (a sequence that cannot be scored is named by its index), or more compute than the "
         "deadline allows (the largest `num_mc` or number of `sequences` that fits)",
    503: "Overloaded: as many requests in flight as the server allows (Retry-After)",
    504: "The request's deadline (`timeout_s`, or the server's maximum) passed"}))
async def score(req: ScoreRequest, request: Request, serving: Serving = Depends(current_serving)):
    return await scores.score(serving, req, gone=request.is_disconnected)


@router.get("/depict", response_class=Response, responses=error_docs.native({
    200: {"description": "The molecule drawn by RDKit", "content": {"image/svg+xml": {}}},
    401: "Missing or unknown API key",
    422: "Not a valid SMILES, or a size out of range: the field and the rule",
    503: "RDKit is not installed on this server"}))
async def depict(smiles: str = Query(min_length=1, max_length=MAX_DEPICT_CHARS, pattern=SMILES_CHARACTERS,
                                     description="A SMILES string: at most 256 printable ASCII characters, no "
                                                 "whitespace (RDKit would read what follows a space as a name)"),
                 width: int = Query(240, ge=MIN_DEPICT_PX, le=MAX_DEPICT_PX, description="pixels, 64..1024"),
                 height: int = Query(240, ge=MIN_DEPICT_PX, le=MAX_DEPICT_PX, description="pixels, 64..1024")):
    """A 2-D depiction of a molecule as SVG (cached)."""
    try:
        svg = await asyncio.to_thread(depict_smiles, smiles, width, height)
    except ImportError:
        return JSONResponse(status_code=503, content={"detail": "RDKit is not installed on this server"})
    if svg is None:
        return JSONResponse(status_code=422, content={"detail": [{
            "loc": ["query", "smiles"], "msg": "not a valid SMILES (RDKit cannot parse and sanitize it)",
            "type": "value_error"}]})
    return Response(svg, media_type="image/svg+xml", headers={"Cache-Control": "private, max-age=86400"})


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def playground():
    return HTMLResponse((PLAYGROUND / "index.html").read_text())  # headers: SecurityHeaders


@router.get("/models", response_model=ModelList)
async def models(serving: Serving = Depends(current_serving)):
    return ModelList(models=[model_info(lm) for lm in serving.registry.models])


def model_info(lm: LoadedModel) -> ModelInfo:
    """A loaded checkpoint's facts with this machine's current compute estimates, as the API sends them."""
    speed = lm.speed
    return ModelInfo(**dataclasses.asdict(lm.info), default_steps=lm.info.default_steps,
                     estimated_seconds={k: speed.estimate(k) for k in Speed.KINDS if speed.timed(k)},
                     estimated_step_overhead_seconds={k: speed.overhead_seconds(k) for k in Speed.KINDS
                                                      if k != WorkKind.chain_rule and speed.timed(k)},
                     estimated_timed_rows={k: speed.timed_rows(k) for k in Speed.KINDS
                                           if k != WorkKind.chain_rule and speed.timed(k)
                                           and speed.timed_rows(k) is not None})


@router.get("/models/{checkpoint}/card", response_class=Response, responses=error_docs.native({
    200: {"description": "The checkpoint's model card", "content": {"text/markdown": {}}},
    404: "No loaded checkpoint of that name has a card"}))
async def model_card(checkpoint: str, serving: Serving = Depends(current_serving)):
    card = next((lm.card for lm in serving.registry.models if lm.name == checkpoint), None)
    if card is None:
        return JSONResponse(status_code=404, content={"detail": "no loaded checkpoint of that name has a card"})
    return PlainTextResponse(card, media_type="text/markdown; charset=utf-8")


@router.get("/health", response_model=StatusAnswer, responses={
    503: {"description": "A worker stopped, or has been on one step longer than the stall limit (`--stall-s`)",
          "model": StatusAnswer}})
async def health(serving: Serving = Depends(current_serving)):
    ok, why = serving.engine.check_health()
    return JSONResponse({"status": "ok" if ok else "unhealthy", "detail": why}, status_code=200 if ok else 503)


@router.get("/ready", response_model=StatusAnswer, responses={
    503: {"description": "Draining (`in_flight`: requests still running), or no model loaded (`refused`: why)",
          "model": StatusAnswer}})
async def ready(serving: Serving = Depends(current_serving)):
    registry = serving.registry
    if serving.engine.draining:  # a load balancer stops sending here; requests in flight finish
        return JSONResponse({"status": "draining", "in_flight": serving.engine.in_flight}, status_code=503)
    if registry.ready:
        return {"status": "ready", "models": len(registry.models), "refused": registry.refused}
    return JSONResponse({"status": "no models loaded", "refused": registry.refused}, status_code=503)


@router.get("/metrics", response_class=Response,  # Response: its errors documented as JSON, not as text
            responses=error_docs.native({200: {"description": "Prometheus text format 0.0.4",
                                                 "content": {"text/plain": {}}}, 401: "Key needed"}))
async def prometheus(serving: Serving = Depends(current_serving)):
    return Response(serving.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
