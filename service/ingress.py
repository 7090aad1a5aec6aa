"""Ray Serve's HTTP ingress: a thin relay in front of the model replicas, so that a request whose replica
dies still gets an answer framed for its client.

A replica (``ModelServer``) runs the whole app of embedded mode (schema, security, engine, SSE) and answers
an HTTP request as a stream of its ASGI messages (``asgi_messages``). The ingress (``Relay``) forwards each
request there through a streaming handle and copies the messages back. When the replica fails mid-request
(its process killed, out of memory) the ingress, which is another process, still answers:
- before the response started: 503 with Retry-After, ``{"detail": ...}``;
- mid-stream on ``/generate``: ``event: error`` with ``code: replica_failed``, then the stream ends;
- mid-stream on ``/v1/completions``: an OpenAI error chunk (``data: {"error": {...}}``), as OpenAI's
  clients expect, then the stream ends.
Ray backpressure (the model deployment's bounded queue is full) is a 503 too. A client that disconnects
cancels its request at the replica (Ray propagates the cancellation; the replica's app sees a disconnect).
The body limit is enforced here as well as on the replica, so an oversized body never crosses Ray.
"""

import asyncio
import json
import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

REPLICA_RETRY_AFTER_S = 5  # a killed replica is replaced within seconds (Serve's health check)
FAILED = "the model replica serving this request failed; retry"
_JOB_ID = re.compile(rb'"id":"([^"]{1,64})"')


class ReplicaFailed(Exception):
    """The model replica went away (or could not be reached, or Ray's queue for it is full) while serving a
    request; ``detail`` is what the client is told."""

    def __init__(self, cause: str, detail: str = FAILED):
        super().__init__(cause)
        self.detail = detail


async def asgi_messages(app, scope: dict, body: bytes):
    """Run ``app`` on one HTTP request and yield its ``send`` messages as they come. The body is received
    at once; afterwards ``receive`` blocks until this generator is closed (the client went away), then
    reports ``http.disconnect``, which is how the app learns to cancel its work."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        await sent.put(message)

    async def run():
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(None)

    task = asyncio.create_task(run())
    try:
        while (message := await sent.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                break
        await task
    finally:
        gone.set()
        if not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5)  # let the app see the disconnect and clean up
            except (asyncio.TimeoutError, Exception):
                task.cancel()


def replica_scope(request: Request) -> dict:
    """The parts of an ingress request's ASGI scope that the app on the replica needs (picklable)."""
    s = request.scope
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": s.get("http_version",
            "1.1"), "method": s["method"], "scheme": s.get("scheme", "http"), "path": s["path"],
            "raw_path": s.get("raw_path") or s["path"].encode(), "root_path": "", "query_string": s.get(
            "query_string", b""), "headers": list(s.get("headers", [])), "client": s.get("client"),
            "server": s.get("server")}


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it passes ``limit`` bytes (by Content-Length or as it arrives)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def failure_chunk(path: str, job_id: str | None) -> bytes:
    """The last chunk of a stream whose replica failed: the route's own error framing."""
    if path.startswith("/v1/"):
        error = {"message": FAILED, "type": "server_error", "param": None, "code": "replica_failed"}
        return f"data: {json.dumps({'error': error}, separators=(',', ':'))}\n\n".encode()
    payload = {"id": job_id, "error": FAILED, "code": "replica_failed"}
    return f"event: error\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def unavailable(detail: str = FAILED) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": str(REPLICA_RETRY_AFTER_S)})


async def relay(messages, path: str) -> Response:
    """An HTTP response from the replica's message stream ``messages`` (an async iterator that raises
    ``ReplicaFailed`` if the replica goes away)."""
    try:
        start = await anext(messages)
    except ReplicaFailed as e:
        return unavailable(e.detail)
    except StopAsyncIteration:
        return unavailable()
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", [])}
    headers.pop("content-length", None)  # the relay streams; the replica's length still holds for its body
    media = headers.pop("content-type", None)
    streaming = (media or "").startswith("text/event-stream")

    async def body():
        job_id = None
        try:
            async for message in messages:
                chunk = message.get("body", b"")
                if streaming and job_id is None and (m := _JOB_ID.search(chunk)):
                    job_id = m.group(1).decode()
                if chunk:
                    yield chunk
        except ReplicaFailed:
            if streaming:
                yield failure_chunk(path, job_id)

    return StreamingResponse(body(), status_code=start["status"], headers=headers, media_type=media)
