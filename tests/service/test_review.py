"""Regression tests of the third review's probes (each failed on the code it was filed against), against
a real uvicorn server unless the part under test is a middleware alone."""

import asyncio
import time

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
