"""Regression tests of the third review's probes (each failed on the code it was filed against), against
a real uvicorn server unless the part under test is a middleware alone."""

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from common import metric

from service.app import RequestMetrics
from service.metrics import Metrics

pytestmark = pytest.mark.slow  # servers


def test_v1_with_a_smiles_pad_prompt_answers_and_holds_no_slot(server):
    """Was a 500 after admission, the job running on with no reader (64 of them filled every slot)."""
    body = {"model": "qm9-tt-r2", "prompt": "C[PAD]", "n": 1, "steps": 4}
    r = httpx.post(server + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"  # the completion ends at the prompt's [PAD]
    streamed = httpx.post(server + "/v1/completions", json=dict(body, stream=True), timeout=60)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    deadline = time.time() + 10
    while metric(httpx.get(server + "/metrics").text, "ttcore_queue_depth") != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert metric(httpx.get(server + "/metrics").text, "ttcore_queue_depth") == 0


def test_a_server_error_is_counted_as_500_not_499():
    metrics = Metrics()

    async def failing_app(scope, receive, send):
        raise RuntimeError("a bug")

    async def run():
        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(message):
            pass
        with pytest.raises(RuntimeError):
            await RequestMetrics(failing_app, metrics)({"type": "http", "path": "/x"}, receive, send)
    asyncio.run(run())
    text = metrics.render().decode()
    assert metric(text, "ttcore_requests_total", 'status="500"') == 1
    assert metric(text, "ttcore_requests_total", 'status="499"') == 0


def test_score_is_admitted_interleaved_with_generation_cancelled_and_keeps_health():
    """The review: text ELBO 4 x 64 ran 58 s after its client left, a 1-sample /generate waited 72 s behind
    it, /health answered 503 meanwhile, and the schema's maximum was about 15 minutes of unadmitted work."""
    import threading

    from servers import start_uvicorn

    root = Path(__file__).resolve().parents[2]
    proc, url = start_uvicorn(root / "checkpoints", "--precision", "bf16", "--stall-s", "4")
    try:
        big = {"model": "text", "sequences": ["The Congress shall"] * 64, "mode": "elbo", "num_mc": 64,
               "timeout_s": 5}
        r = httpx.post(url + "/score", json=big, timeout=60)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] in ("num_mc", "sequences"), r.text
        long = {"model": "text", "sequences": ["The Congress shall make no law"] * 4, "mode": "elbo", "num_mc": 64}
        scored = []
        worker = threading.Thread(target=lambda: scored.append(httpx.post(url + "/score", json=long, timeout=300)))
        worker.start()
        time.sleep(1.0)
        t0 = time.perf_counter()
        small = httpx.post(url + "/generate", json={"model": "text", "num_samples": 1, "steps": 4}, timeout=60)
        waited = time.perf_counter() - t0
        health = httpx.get(url + "/health")
        worker.join()
        assert small.status_code == 200 and health.status_code == 200, health.text
        assert scored[0].status_code == 200 and all(s["nll_per_token"] > 0 for s in scored[0].json()["scores"])
        assert waited < 5, waited  # between the score's pieces, not after all of them
        # a client that leaves cancels its score: the next request does not wait behind it
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/score", json=long, timeout=1.0)
        time.sleep(1.0)
        t0 = time.perf_counter()
        assert httpx.post(url + "/generate", json={"model": "text", "num_samples": 1, "steps": 4},
                          timeout=60).status_code == 200
        assert time.perf_counter() - t0 < 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
