"""A drain past its timeout, as clients see it (a real server on the bundled text checkpoint, whose 4 x 128
stream takes far longer than the drain allows): every stream in flight ends with an error event ``code:
shutdown`` (native SSE and OpenAI's chunks), never a cut connection, and the process exits once they are
answered, not after a further graceful wait (its log, not a clock, says which)."""

import json
import signal
import threading
import time

import httpx
import pytest
from servers import ROOT, start_uvicorn, stderr_tail

pytestmark = pytest.mark.slow  # a server

DRAIN_S = 3.0
LONG = {"model": "text", "num_samples": 4, "steps": 128, "seed": 0, "stream": True}


def _read(url: str, path: str, body: dict, into: list) -> None:
    try:
        with httpx.stream("POST", url + path, json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    into.append(line)
    except httpx.HTTPError as e:  # a connection cut without a closing event
        into.append(f"CUT {type(e).__name__}")


def test_a_drain_past_its_timeout_ends_every_stream_with_a_shutdown_event_and_exits(tmp_path):
    (tmp_path / "text-tt-r4").symlink_to(ROOT / "checkpoints" / "text-tt-r4")
    proc, url = start_uvicorn(tmp_path, "--drain-timeout-s", str(DRAIN_S), "--log-level", "info")
    native, openai = [], []
    readers = [threading.Thread(target=_read, args=(url, "/generate", LONG, native)),
               threading.Thread(target=_read, args=(url, "/v1/completions", {
                   "model": "text", "prompt": "The", "n": 4, "stream": True, "steps": 128}, openai))]
    try:
        for r in readers:
            r.start()
        deadline = time.time() + 120
        while not (len(native) > 1 and openai) and time.time() < deadline:  # both in flight: a step arrived
            time.sleep(0.05)
        assert native and openai, "the streams did not start"
        proc.send_signal(signal.SIGTERM)
        for r in readers:
            r.join(timeout=60)
        code = proc.wait(timeout=60)
        log = stderr_tail(proc, 200_000)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert native[-2] == "event: error" and json.loads(native[-1][6:])["code"] == "shutdown", native[-3:]
    assert not any(line.startswith("CUT") for line in native + openai), (native[-2:], openai[-2:])
    error = json.loads(openai[-2][6:])["error"]
    assert error["code"] == "shutdown" and openai[-1] == "data: [DONE]", openai[-3:]
    assert code == 0
    # the drain cut the streams, answered them and exited itself: uvicorn never waited on connections left open
    # (the bug this guards: 8.7 s of graceful wait after the streams had ended)
    assert "drain timed out" in log and "drained: exiting" in log, log[-2000:]
    assert "Waiting for connections to close" not in log and "graceful shutdown exceeded" not in log, log[-2000:]
