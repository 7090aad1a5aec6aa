"""Client helpers shared by the uvicorn and Ray Serve tests."""

import json
import re

import httpx
import torch

from service.schema import GenerateRequest
from ttcore.models import load_for_inference
from ttcore.sampling import GenerationRun


def stream_events(url: str, body: dict, timeout: float = 120) -> list[tuple[float | None, str, dict]]:
    """POST with stream: true; (in flight, event, payload) as each event arrives. In flight, on the first step
    event only (None on the others): the server's count of admitted, unfinished requests (``ttcore_queue_depth``)
    read as it arrived; >= 1 means it was sent while its request ran, not buffered to the end."""
    out, probed = [], False
    with httpx.stream("POST", url + "/generate", json=dict(body, stream=True), timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                depth = None
                if event == "step" and not probed:
                    probed = True
                    depth = metric(httpx.get(url + "/metrics", timeout=timeout).text, "ttcore_queue_depth")
                out.append((depth, event, json.loads(line[6:])))
    return out


def lone_run_texts(checkpoint_dir, body: dict, precision: str = "fp32", kv_cache: bool = True) -> list[str]:
    """What the same request gives when run alone through the library (``GenerationRun`` with the request's
    own ``SamplerConfig``: the schema's defaults, typed once; ``kv_cache``: an autoregressive model's)."""
    model, tok, _ = load_for_inference(checkpoint_dir, "cpu", precision)
    config = GenerateRequest(**{k: v for k, v in body.items() if k != "stream"}).to_sampler_config()
    prompt = None
    if body.get("prompt"):
        ids = tok.tokenize(body["prompt"], allow_mask=True)
        prompt = torch.tensor(ids + [tok.mask_id] * (tok.length - len(ids)))
    torch.set_num_threads(1)
    run = GenerationRun(model, body["num_samples"], body["steps"], config, seed=body["seed"], prompt=prompt,
                        kv_cache=kv_cache)
    with model.compute_context():
        while not run.done:
            run.step()
    return [tok.decode(row) for row in run.tokens.tolist()]


def metric(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of one Prometheus series (optionally filtered by a label substring)."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total
