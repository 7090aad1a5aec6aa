"""HTTP transport: the app over ``serving``: middlewares, the error handlers (request validation, every refusal
in each front end's shape, bugs), and the routers (``service.routes``, ``service.openai_api``).

    POST /generate   JSON answer, or text/event-stream with `stream: true`
    GET  /models     every loaded checkpoint          GET /depict    a molecule as SVG
    GET  /           the playground page (service/playground/, static)
    GET  /health     liveness          GET /ready   models loaded          GET /metrics   Prometheus
"""

import asyncio
import contextlib
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from .config import ServiceArgs
from .openai_api import openai_error, openai_refused
from .openai_api import router as openai_router
from .refusals import REFUSED, Refusal, refusal
from .routes import PLAYGROUND, router
from .security import DOCS_ASSETS, SecurityConfig, SecurityHeaders, SecurityMiddleware, clip, error_body
from .serving import Serving

log = logging.getLogger("ttcore.app")

LOOP_PROBE_S = 0.02  # how often the event-loop probe wakes (``probe_event_loop``)


async def probe_event_loop(metrics, interval_s: float = LOOP_PROBE_S) -> None:
    """How long the event loop is held: sleep ``interval_s``, and count how late each wake-up came
    (``ttcore_event_loop_lag_seconds``, its largest ``ttcore_event_loop_lag_max_seconds``). A late wake-up is
    time no request, /health or /ready could be answered in; work that takes more than a few milliseconds
    belongs on a thread or a model's worker."""
    loop, largest = asyncio.get_running_loop(), 0.0
    while True:
        start = loop.time()
        await asyncio.sleep(interval_s)
        late = max(0.0, loop.time() - start - interval_s)
        metrics.loop_lag.observe(late)
        if late > largest:
            largest = late
            metrics.loop_lag_max.set(largest)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    """While the app serves: the event-loop probe (uvicorn and Ray Serve's replicas both run an app's lifespan)."""
    probe = asyncio.create_task(probe_event_loop(app.state.serving.metrics), name="event-loop-probe")
    try:
        yield
    finally:
        probe.cancel()


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
    app = FastAPIOffline(title="ttcore", version="0.1.0", static_url=DOCS_ASSETS, lifespan=lifespan,
                  description="Few-step masked diffusion with CP / Tensor-Train joint distributions. With API "
                              "keys configured, every route but /health and /ready needs `Authorization: Bearer "
                              "<key>` (/metrics and the docs unless the server makes them public).")
    app.add_middleware(SecurityMiddleware, config=security, metrics=serving.metrics)
    app.add_middleware(SecurityHeaders)
    if security.cors_origins:  # added last: outermost, so preflight requests are answered before the key check
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(security.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])
    app.add_middleware(RequestMetrics, metrics=serving.metrics)

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
        if not_json:  # as the OpenAPI document says: 400 for a body that is not JSON (no field is at fault)
            message = "the body is not valid JSON: " + next(e["msg"] for e in errors if e["type"] == "json_invalid")
            if request.url.path.startswith("/v1/"):
                return openai_error(400, message, None)
            return JSONResponse(status_code=400, content={"detail": message})
        if request.url.path.startswith("/v1/"):  # OpenAI clients expect their error object
            first = errors[0]
            field = ".".join(p for p in first["loc"] if p != "body")
            return openai_error(400, f"{field}: {first['msg']}" if field else first["msg"], field or None)
        return JSONResponse(status_code=422, content={"detail": errors})

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)
    for refused in (*REFUSED, ValidationError):  # one handler for every refusal, in each front end's shape
        app.add_exception_handler(refused, refusal_response)
    app.state.serving = serving
    app.include_router(openai_router)
    app.include_router(router)
    app.mount("/playground", StaticFiles(directory=PLAYGROUND), name="playground")
    return app


async def refusal_response(request: Request, exc: Exception) -> Response:
    """A refused request (one of ``REFUSED``), answered in its front end's error shape: OpenAI's error object
    under /v1 (with a request that its translation into a generation request refuses, pydantic's
    ``ValidationError``), else FastAPI's ``detail``. A ``ValidationError`` elsewhere is a bug: 500."""
    v1 = request.url.path.startswith("/v1/")
    if isinstance(exc, ValidationError):
        if not v1:
            return await server_error(request, exc)
        err = exc.errors()[0]
        return openai_error(400, f"{'.'.join(map(str, err['loc']))}: {err['msg']}", str(err["loc"][-1]))
    return openai_refused(refusal(exc)) if v1 else _refused(refusal(exc))


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's and FastAPI's own refusals (an unknown path, a method not allowed, a body FastAPI cannot
    read) in the route's error shape: OpenAI's error object under /v1 too, as the document says."""
    detail = exc.detail if isinstance(exc.detail, str) else "refused"
    if detail == "There was an error parsing the body":  # FastAPI's words for a body that is not UTF-8 JSON
        detail = "the body is not valid JSON: it is not UTF-8 text"
    return Response(error_body(request.url.path, exc.status_code, clip(detail)), status_code=exc.status_code,
                    headers=exc.headers, media_type="application/json")


async def server_error(request: Request, exc: Exception) -> Response:
    """A bug: 500 without the exception's text (it may hold paths), in the route's error shape."""
    log.error("unhandled error on %s", request.url.path, exc_info=exc)
    return Response(error_body(request.url.path, 500, "internal server error"), status_code=500,
                    media_type="application/json")
