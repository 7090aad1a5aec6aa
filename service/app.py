"""HTTP transport: FastAPI routes and server-sent-event framing over ``serving``.

    POST /generate   JSON answer, or text/event-stream with `stream: true`
    GET  /models     every loaded checkpoint          GET /depict    a molecule as SVG
    GET  /           the playground page (service/playground/, static)
    GET  /health     liveness          GET /ready   models loaded          GET /metrics   Prometheus
"""

import asyncio
import json
import logging
import time
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from .config import ServiceArgs
from .openai_api import openai_error, openai_router
from .schema import GenerateRequest, GenerateResponse, ModelList, ScoreRequest, ScoreResponse, StepEvent
from .security import DOCS_ASSETS, SecurityConfig, SecurityHeaders, SecurityMiddleware, clip, error_body
from .serving import Failure, Serving
from .serving import depict as depict_smiles
from .statuses import REFUSED, Refusal, failure_status, refusal

MAX_DEPICT_CHARS = 256
MIN_DEPICT_PX, MAX_DEPICT_PX = 64, 1024
PLAYGROUND = Path(__file__).resolve().parent / "playground"  # the page at / (static files, no build step)
log = logging.getLogger("ttcore.app")


def _sse(item: StepEvent | GenerateResponse | Failure) -> bytes:
    """One server-sent event: ``step``, ``done`` (the answer) or ``error``."""
    if isinstance(item, Failure):
        event, payload = "error", item.payload()
    else:
        event, payload = ("step" if isinstance(item, StepEvent) else "done"), item.model_dump()
    return f"event: {event}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def _refused(r: Refusal) -> JSONResponse:
    """A refusal in this API's shape: 422 as FastAPI's own validation errors (the field as loc, the rule as
    msg); otherwise ``detail`` (and, for 404, the checkpoints ``available``)."""
    if r.status == 422:
        loc = ["body", *(clip(p, 64) if isinstance(p, str) else p for p in r.loc)]
        return JSONResponse(status_code=422, content={"detail": [{"loc": loc, "msg": clip(r.message),
                                                                  "type": "value_error"}]})
    content = {"detail": r.message} if r.available is None else {"detail": r.message, "available": r.available}
    return JSONResponse(status_code=r.status, content=content, headers=r.headers or None)


def public_errors(errors) -> list[dict]:
    """Validation errors as the field (loc), the rule (msg) and its type: never the input itself, which
    may be huge, or not encodable (infinities, lone surrogates), and is the client's own anyway; a field
    name the client made up (an unknown field) is cut to 64 characters."""
    return [{"loc": [clip(part, 64) for part in e.get("loc", ())], "msg": clip(e.get("msg", "invalid")),
             "type": str(e.get("type", "value_error"))} for e in errors]


SSE_EVENT = {"type": "object", "required": ["event", "data"], "properties": {
    "event": {"type": "string", "enum": ["step", "done", "error"]},
    "data": {"type": "string", "description": "JSON: a StepEvent, a GenerateResponse or {id, error, code}"}}}
GENERATE_RESPONSES = {
    200: {"description": "The samples (JSON); with `stream: true` a server-sent-event stream instead: `event: step` "
                         "per denoising step (StepEvent), then `event: done` (the JSON answer) or `event: error` "
                         "(`{id, error, code}`, code `timeout`, `failed`, `cancelled`, or under Ray Serve "
                         "`replica_failed`); every event carries the request's `id`",
          "content": {"text/event-stream": {"schema": SSE_EVENT}}},
    400: {"description": "The body is not JSON"},
    401: {"description": "Missing or unknown API key (when keys are configured)"},
    404: {"description": "No loaded checkpoint matches; the answer names what is available"},
    413: {"description": "The body is larger than the server's limit"},
    422: {"description": "Invalid input, or more compute or memory than the server's limits: the field and the "
                         "rule (for limits, the largest value that fits)"},
    500: {"description": "A denoising step failed"},
    503: {"description": "Overloaded; retry after the Retry-After header (seconds until a slot frees, estimated)"},
    504: {"description": "The request's deadline (`timeout_s`, or the server's maximum) passed"},
}


class RequestMetrics:
    """ASGI middleware: requests by route and status, and latency (streams: see the /generate route).
    Pure ASGI, not BaseHTTPMiddleware, which hides client disconnects from the routes."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, seen = time.perf_counter(), {}

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                seen["stream"] = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                     for k, v in message.get("headers", []))
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            seen.setdefault("status", 500)  # the server failed (Starlette answers 500), not the client
            raise
        finally:
            route = scope.get("route")
            path = route.path if route is not None else "unmatched"
            self.metrics.requests.labels(path, str(seen.get("status", 499))).inc()  # 499: no answer was started
            if not seen.get("stream"):
                self.metrics.latency.labels(path).observe(time.perf_counter() - start)


def create_app(serving: Serving, security: SecurityConfig | None = None) -> FastAPI:
    """The API over ``serving``; ``security``: API keys, body limit, CORS (default: open, 1 MiB, no CORS)."""
    security = security or SecurityConfig.from_args(ServiceArgs())
    # the API pages (/docs, /redoc) with Swagger UI and ReDoc served from the fastapi-offline package, not a
    # CDN: they render on a machine without internet access
    app = FastAPIOffline(title="ttcore", version="0.1.0", static_url=DOCS_ASSETS,
                  description="Few-step masked diffusion with CP / Tensor-Train joint distributions. With API "
                              "keys configured, every route but /health and /ready needs `Authorization: Bearer "
                              "<key>` (/metrics and the docs unless the server makes them public).")
    app.add_middleware(SecurityMiddleware, config=security, metrics=serving.metrics)
    app.add_middleware(SecurityHeaders)
    if security.cors_origins:  # added last: outermost, so preflight requests are answered before the key check
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(security.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])
    metrics, registry = serving.metrics, serving.registry
    app.add_middleware(RequestMetrics, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = public_errors(exc.errors())
        not_json = any(e["type"] == "json_invalid" for e in errors)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        body_refused = any(e["loc"][:1] == ["body"] for e in errors)
        if body_refused and not (content_type == "application/json" or content_type.endswith("+json")):
            # FastAPI parses only a JSON content type; anything else arrives as raw bytes and read as "Input
            # should be a valid dictionary", which names neither the cause nor the fix
            message = (f"the body must be JSON sent with content-type: application/json (this request's content "
                       f"type: {clip(content_type or 'none', 64)!r}; curl: -H 'content-type: application/json')")
            if request.url.path.startswith("/v1/"):
                return openai_error(400, message, None)
            return JSONResponse(status_code=400, content={"detail": message})
        if request.url.path.startswith("/v1/"):  # OpenAI clients expect their error object
            first = errors[0]
            field = ".".join(p for p in first["loc"] if p != "body")
            return openai_error(400, f"{field}: {first['msg']}" if field else first["msg"], field or None)
        if not_json:  # as the OpenAPI document says: 400 for a body that is not JSON
            return JSONResponse(status_code=400, content={"detail": "the body is not valid JSON: " + errors[0]["msg"]})
        return JSONResponse(status_code=422, content={"detail": errors})

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception):
        """A bug: 500 without the exception's text (it may hold paths), in the route's error shape."""
        log.exception("unhandled error on %s", request.url.path)
        return Response(error_body(request.url.path, 500, "internal server error"), status_code=500,
                        media_type="application/json")

    app.include_router(openai_router(serving))

    @app.post("/generate", response_model=GenerateResponse, responses=GENERATE_RESPONSES)
    async def generate(req: GenerateRequest, request: Request):
        try:
            job = await serving.admit(req)
        except REFUSED as e:
            return _refused(refusal(e))
        start = time.perf_counter()
        if req.stream:
            async def stream():
                async for item in serving.events(job, request=req):
                    yield _sse(item)
                    if isinstance(item, GenerateResponse):
                        metrics.latency.labels("/generate").observe(time.perf_counter() - start)
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

    @app.post("/score", response_model=ScoreResponse, responses={
        400: {"description": "The body is not JSON"}, 401: {"description": "Missing or unknown API key"},
        404: {"description": "No loaded checkpoint matches"}, 413: {"description": "Body too large"},
        422: {"description": "Invalid input (a sequence that cannot be scored is named by its index), or more "
                             "compute than the deadline allows (the largest `num_mc` or number of `sequences` "
                             "that fits)"},
        504: {"description": "The request's deadline (`timeout_s`, or the server's maximum) passed"}})
    async def score(req: ScoreRequest, request: Request):
        try:
            return await serving.score(req, gone=request.is_disconnected)
        except REFUSED as e:  # a cancelled request's answer: nobody reads it
            return _refused(refusal(e))

    @app.get("/depict", response_class=Response, responses={
        200: {"description": "The molecule drawn by RDKit", "content": {"image/svg+xml": {}}},
        401: {"description": "Missing or unknown API key"},
        422: {"description": "Not a valid SMILES, or a size out of range: the field and the rule"},
        503: {"description": "RDKit is not installed on this server"}})
    async def depict(smiles: str = Query(min_length=1, max_length=MAX_DEPICT_CHARS,
                                         description="A SMILES string (at most 256 characters)"),
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

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground():
        return HTMLResponse((PLAYGROUND / "index.html").read_text())  # headers: SecurityHeaders

    app.mount("/playground", StaticFiles(directory=PLAYGROUND), name="playground")

    @app.get("/models", response_model=ModelList)
    async def models():
        return ModelList(models=registry.model_infos())

    @app.get("/models/{checkpoint}/card", response_class=PlainTextResponse, responses={
        200: {"description": "The checkpoint's model card", "content": {"text/markdown": {}}},
        404: {"description": "No loaded checkpoint of that name has a card"}})
    async def model_card(checkpoint: str):
        card = next((lm.card for lm in registry.models if lm.name == checkpoint), None)
        if card is None:
            return JSONResponse(status_code=404, content={"detail": "no loaded checkpoint of that name has a card"})
        return PlainTextResponse(card, media_type="text/markdown; charset=utf-8")

    @app.get("/health", responses={503: {"description": "A worker stopped, or has been on one step longer than "
                                                          "the stall limit (`--stall-s`)"}})
    async def health():
        ok, why = serving.engine.check_health()
        return JSONResponse({"status": "ok" if ok else "unhealthy", "detail": why}, status_code=200 if ok else 503)

    @app.get("/ready")
    async def ready():
        if registry.ready:
            return {"status": "ready", "models": len(registry.models), "refused": registry.refused}
        return JSONResponse({"status": "no models loaded", "refused": registry.refused}, status_code=503)

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text format 0.0.4"}, 401: {"description": "Key needed"}})
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
