"""The same app under a real local Ray Serve application, through Ray's HTTP proxy (serving bf16)."""

import json
import os
import signal
import time

import httpx
import pytest
from common import lone_run_texts, stream_events

from service.deployment import replica_pids

pytestmark = pytest.mark.slow  # servers, Ray, training or end-to-end commands


def test_ray_serve_streams_and_validates(ray_server, checkpoints):
    models = httpx.get(ray_server + "/models").json()["models"]
    assert len(models) == 4
    length = next(m for m in models if m["model"] == "qm9")["length"]
    # 256 sequences: long enough that the probe at the first event finds it running even beside another test worker
    # (32 finished first once in a CI run: in flight 0 although streamed)
    body = dict(num_samples=256, steps=25, seed=5, ordering="top_prob")
    events = stream_events(ray_server, body)
    steps = [e for e in events if e[1] == "step"]
    assert len(steps) == min(25, length) and events[-1][1] == "done"  # idle steps send no event
    assert steps[0][0] >= 1  # the first step's event arrived while its request still ran: not buffered to the end
    assert [s["text"] for s in events[-1][2]["samples"]] == lone_run_texts(checkpoints / "qm9-tt-r2", body, "bf16")
    r = httpx.post(ray_server + "/generate", json=dict(steps=0))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "steps"
    r = httpx.post(ray_server + "/generate", json=dict(model="nope"))
    assert r.status_code == 404
    assert "ttcore_requests_total" in httpx.get(ray_server + "/metrics").text
    # the playground and its pictures through the relay
    page = httpx.get(ray_server + "/")
    assert page.status_code == 200 and "playground.js" in page.text and "content-security-policy" in page.headers
    assert httpx.get(ray_server + "/playground/playground.js").status_code == 200
    svg = httpx.get(ray_server + "/depict", params={"smiles": "CCO"})
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"


def test_a_killed_replica_ends_its_stream_with_an_error_event_and_is_replaced(ray_server):
    """SIGKILL the model replica mid-stream: the ingress ends the client's stream with `event: error`
    (code replica_failed, the job's id) before the client's read timeout, Serve starts a new replica, and a new
    request succeeds on it. How soon the replacement answers is the machine's speed, not the subject: a fresh
    replica loads its checkpoints, which took over 30 s on two cores beside a training run, so the wait below is
    a hang guard (180 s), not a promise."""
    (pid,) = replica_pids()
    events, data = [], []
    with httpx.stream("POST", ray_server + "/generate", json=dict(model="text", num_samples=64, steps=1000,
                                                                  ordering="entropy", stream=True),
                      timeout=httpx.Timeout(60, read=30)) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
                if len(events) == 2:
                    os.kill(pid, signal.SIGKILL)
            elif line.startswith("data: "):
                data.append(json.loads(line[6:]))
    # ended by the ingress's error event, not by the client's read timeout (30 s, the hang guard)
    assert events[-1] == "error" and "done" not in events, events[-3:]
    assert data[-1]["code"] == "replica_failed" and data[-1]["id"] == data[0]["id"]
    deadline = time.time() + 180  # a hang guard (the docstring)
    while True:
        try:
            r = httpx.post(ray_server + "/generate", json=dict(num_samples=1, steps=2), timeout=10)
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, "no replica answered within 180 s of the kill"
        time.sleep(0.5)
    assert replica_pids() and pid not in replica_pids()


def test_sigterm_drains_a_ray_serve_application_before_it_stops():
    """Issue 54, graceful drain under Ray Serve: on SIGTERM ``python -m service.deployment`` has every replica
    answer /ready with 503 (draining) and new requests with 503 + Retry-After, lets the stream in flight finish
    with its answer, then stops Serve and Ray and exits 0 (it was ``serve.shutdown()`` at once)."""
    from pathlib import Path

    from servers import check_drain, start_ray_serve

    root = Path(__file__).resolve().parents[2]
    check_drain(*start_ray_serve({"checkpoints": str(root / "checkpoints"), "threads": 1, "precision": "bf16"}, None,
                                 "--drain-timeout-s", "300"))  # the stream finishes within it on a slow CPU too
