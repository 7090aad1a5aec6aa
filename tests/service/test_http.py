"""HTTP request handling against a real uvicorn server (a middleware alone where that is the part under test):
refusals that name the field and never echo the input, strict types, bodies that are not JSON, and how requests
are counted."""

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


def test_errors_do_not_echo_a_clients_huge_input(server):
    huge = "x" * ((1 << 20) // 2)
    r = httpx.post(server + "/generate", json={"model": "qm9", huge: 1}, timeout=60)
    assert r.status_code == 422 and len(r.content) < 2000, len(r.content)
    v1 = httpx.post(server + "/v1/completions", json={"model": "qm9-tt-r2", "prompt": "C", huge: 1}, timeout=60)
    assert v1.status_code == 400 and "error" in v1.json() and len(v1.content) < 2000, len(v1.content)
    prompt = httpx.post(server + "/generate", json={"model": "qm9", "prompt": "Q" * 8192}, timeout=60)
    assert prompt.status_code == 422 and len(prompt.content) < 2000, prompt.text[:300]


def test_strict_types_refuse_coerced_numbers_and_booleans(server):
    for body, field in (({"seed": False}, "seed"), ({"rank": True}, "rank"), ({"num_samples": "4"}, "num_samples"),
                        ({"num_samples": 4.0}, "num_samples"), ({"unique": 1}, "unique")):
        r = httpx.post(server + "/generate", json=dict(body, model="qm9"), timeout=60)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], (body, r.text)
    score = httpx.post(server + "/score", json={"model": "qm9", "sequences": ["C"], "num_mc": "3", "mode": "elbo"})
    assert score.status_code == 422 and score.json()["detail"][0]["loc"] == ["body", "num_mc"]
    ok = httpx.post(server + "/generate", json={"model": "qm9", "num_samples": 1, "steps": 2, "temperature": 1},
                    timeout=60)  # an integer where a number is asked is a number
    assert ok.status_code == 200, ok.text


def test_malformed_json_is_a_400_and_v1_errors_are_openai_objects(server):
    r = httpx.post(server + "/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["detail"]
    v1 = httpx.post(server + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert v1.status_code == 400 and set(v1.json()["error"]) >= {"message", "type", "param", "code"}
    # no field is at fault: the error names the body, not a position in it as a param
    assert v1.json()["error"]["param"] is None and "not valid JSON" in v1.json()["error"]["message"], v1.text
    too_big = httpx.post(server + "/v1/completions", content=b"x" * (2 << 20), headers={"content-type": "text/plain"})
    assert too_big.status_code == 413 and "error" in too_big.json()
