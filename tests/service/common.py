"""Client helpers shared by the uvicorn and Ray Serve tests."""

import json
import re
import time

import httpx
import torch

from ttcore.models import load_for_inference
from ttcore.sampling import generate


def stream_events(url: str, body: dict, timeout: float = 120) -> list[tuple[float, str, dict]]:
    """POST with stream: true; (arrival time, event, payload) as each event arrives."""
    out, t0 = [], time.perf_counter()
    with httpx.stream("POST", url + "/generate", json=dict(body, stream=True), timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((time.perf_counter() - t0, event, json.loads(line[6:])))
    return out


def lone_run_texts(checkpoint_dir, body: dict, precision: str = "fp32") -> list[str]:
    """What the same request gives when run alone through ttcore.sampling.generate."""
    model, tok, _ = load_for_inference(checkpoint_dir, "cpu", precision)
    settings = dict(ordering=body.get("ordering", "random"), seed=body["seed"],
                    eb_gamma=body.get("eb_gamma", 0.5) if body.get("sampler") == "eb" else None,
                    temperature=body.get("temperature", 1.0), contraction=body.get("contraction", "head"))
    prompt = None
    if body.get("prompt"):
        ids = tok.tokenize(body["prompt"], allow_mask=True)
        prompt = torch.tensor(ids + [tok.mask_id] * (tok.length - len(ids)))
    torch.set_num_threads(1)
    with model.compute_context():
        *_, last = generate(model, body["num_samples"], body["steps"], prompt=prompt, **settings)
    return [tok.decode(row) for row in last.tokens.tolist()]


def metric(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of one Prometheus series (optionally filtered by a label substring)."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total
