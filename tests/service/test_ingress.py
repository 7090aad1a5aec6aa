"""The Ray ingress's relay (service/ingress.py), run on the real app in this process: the app's messages come
back as its HTTP answer, and a replica that fails is answered for in the route's own framing."""

import asyncio
import json

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from starlette.requests import Request

from service.ingress import ReplicaFailed, asgi_messages, relay


def _app():
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        return {"body": (await request.body()).decode(), "path": request.url.path}

    @app.post("/v1/completions")
    @app.post("/generate")
    async def generate():
        async def events():
            for step in range(3):
                yield f'event: step\ndata: {{"id":"job1","step":{step}}}\n\n'
        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _scope(path: str) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}


async def _answer(response) -> tuple[int, dict, bytes]:
    """Run a Starlette response as ASGI and collect it."""
    sent = []

    async def receive():
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    await response(_scope("/"), receive, send)
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


async def _failing_after(messages, n: int):
    """The replica's messages, then a failure after ``n`` of them (as a killed replica's stream raises)."""
    count = 0
    async for m in messages:
        if count == n:
            raise ReplicaFailed("ActorDiedError")
        count += 1
        yield m


def test_relay_copies_the_apps_answer():
    async def run():
        return await _answer(await relay(asgi_messages(_app(), _scope("/echo"), b"hello"), "/echo"))

    status, headers, body = asyncio.run(run())
    assert status == 200 and json.loads(body) == {"body": "hello", "path": "/echo"}


def test_a_replica_failure_is_a_503_before_the_answer_starts_and_an_error_event_after():
    async def run(path, n):
        response = await relay(_failing_after(asgi_messages(_app(), _scope(path), b""), n), path)
        return await _answer(response)

    status, headers, body = asyncio.run(run("/generate", 0))
    assert status == 503 and headers[b"retry-after"] == b"5" and b"failed" in body
    status, _, body = asyncio.run(run("/generate", 3))  # the start and two events, then the failure
    events = [block for block in body.decode().split("\n\n") if block]
    assert status == 200 and len(events) == 3 and events[-1].startswith("event: error\n")
    assert json.loads(events[-1].split("data: ")[1]) == {"id": "job1", "error": "the model replica serving this "
                                                         "request failed; retry", "code": "replica_failed"}
    _, _, body = asyncio.run(run("/v1/completions", 2))
    last = json.loads(body.decode().strip().split("\n\n")[-1][len("data: "):])
    assert last["error"]["code"] == "replica_failed" and last["error"]["type"] == "server_error"
