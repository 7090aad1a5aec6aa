"""The same app under a real local Ray Serve application, through Ray's HTTP proxy (serving bf16)."""

import httpx
import pytest
from common import lone_run_texts, stream_events

pytestmark = pytest.mark.slow  # servers, Ray, training or end-to-end commands


def test_ray_serve_streams_and_validates(ray_server, checkpoints):
    models = httpx.get(ray_server + "/models").json()["models"]
    assert len(models) == 4
    body = dict(num_samples=32, steps=25, seed=5, ordering="top_prob")
    events = stream_events(ray_server, body)
    steps = [e for e in events if e[1] == "step"]
    assert len(steps) == 25 and events[-1][1] == "done"
    assert events[-1][0] - steps[0][0] > 0.3 * events[-1][0]  # incremental through the proxy
    assert [s["text"] for s in events[-1][2]["samples"]] == lone_run_texts(checkpoints / "qm9-tt-r2", body, "bf16")
    r = httpx.post(ray_server + "/generate", json=dict(steps=0))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "steps"
    r = httpx.post(ray_server + "/generate", json=dict(model="nope"))
    assert r.status_code == 404
    assert "ttcore_requests_total" in httpx.get(ray_server + "/metrics").text
