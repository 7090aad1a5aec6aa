"""Load on the embedded server: concurrent clients against the same requests served one at a time.

    python benchmarks/service_load.py                          # bundled checkpoints/ (qm9)
    python benchmarks/service_load.py --checkpoints DIR --requests-per-client 4
    python benchmarks/service_load.py --clients 1 2 --requests-per-client 1    # smoke size (the tests run it)
    python benchmarks/service_load.py --model text --clients 8 --requests-per-client 1 \
        --request '{"sampler": "eb", "eb_gamma": 0.5, "steps": 16, "adaptive_path": "fast"}'   # EB on text
    git worktree add /tmp/before <commit>                            # before / after, side by side:
    python benchmarks/service_load.py --baseline-tree /tmp/before   # the same load on both, alternating

Starts `python -m service` (uvicorn) in a subprocess on a free port. For C in {1, 8, 32} concurrent
clients, each sends R requests in a row (2 sequences, 8 steps, random order, unless ``--request`` sets other
fields); the baseline sends the same C * R requests one at a time. Prints sequences/s, the tokens committed
per second, p50/p99 latency, the speed-up, the share of server wall time spent in the backbone's forward
pass, and the share the engine's worker was busy with steps at all (forward, heads, joint draws, the copy
to the host), from the server's own metrics: the rest is HTTP, events and the event loop. With
``--baseline-tree``, a second server runs from that checkout (another commit) and every row is measured on
both, one after the other, in the same run.
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _server import start

ROOT = Path(__file__).resolve().parent.parent


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def _client(http, url, body, n, latencies):
    for _ in range(n):
        t0 = time.perf_counter()
        r = await http.post(url + "/generate", json=body)
        r.raise_for_status()
        latencies.append(time.perf_counter() - t0)


async def _run(url, body, clients, per_client):
    latencies = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as http:
        before = (await http.get(url + "/metrics")).text
        t0 = time.perf_counter()
        await asyncio.gather(*[_client(http, url, body, per_client, latencies) for _ in range(clients)])
        wall = time.perf_counter() - t0
        after = (await http.get(url + "/metrics")).text
    forward, engine = (_metric(after, f"ttcore_{m}_seconds_total") - _metric(before, f"ttcore_{m}_seconds_total")
                       for m in ("forward", "engine_step"))
    tokens = _metric(after, "ttcore_tokens_generated_total") - _metric(before, "ttcore_tokens_generated_total")
    return wall, latencies, forward, engine, tokens


def _start(tree: Path, args) -> tuple[str, subprocess.Popen]:
    """``python -m service`` from the checkout ``tree`` on a free port, ready; -> (url, process)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc, url = start([sys.executable, "-m", "service", "--checkpoints", args.checkpoints, "--log-level", "warning",
                       "--precision", args.precision, "--device", args.device, *args.server_args.split()],
                      cwd=tree, env=env)
    return url, proc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", default=str(ROOT / "checkpoints"))
    ap.add_argument("--model", default="qm9")
    ap.add_argument("--decomposition", default=None)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrency levels to measure")
    ap.add_argument("--request", default="{}", help="JSON fields that replace the request's defaults")
    ap.add_argument("--baseline-tree", default=None, help="another checkout served side by side (before / after)")
    ap.add_argument("--server-args", default="", help="extra flags for the server(s), e.g. --no-cuda-graphs")
    args = ap.parse_args()
    trees = [("this tree", ROOT)] + ([("baseline", Path(args.baseline_tree).resolve())] if args.baseline_tree else [])
    servers = [(label, *_start(tree, args)) for label, tree in trees]  # (label, url, process)
    url = servers[0][1]
    try:
        body = {"model": args.model, "num_samples": 2, "steps": 8, "ordering": "random", **json.loads(args.request)}
        if args.decomposition:
            body["decomposition"] = args.decomposition
        info = httpx.post(url + "/generate", json=body, timeout=600).json()  # warm-up
        settings = {k: v for k, v in body.items() if k not in ("model", "decomposition")}
        print(f"checkpoint {info['checkpoint']} ({info['decomposition']} r={info['rank']}), requests {settings}, "
              f"{args.requests_per_client} requests per client, {args.precision}")
        print(f"{'clients':>7} | {'seq/s':>7} {'tokens/s':>8} {'p50 s':>7} {'p99 s':>7} | {'1-at-a-time seq/s':>17} | "
              f"{'speed-up':>8} | {'forward share':>13} | {'engine busy':>11}")
        for _, other, _ in servers[1:]:
            httpx.post(other + "/generate", json=body, timeout=600).raise_for_status()  # its warm-up
        for clients in args.clients:
            for label, server, _ in servers:
                n = clients * args.requests_per_client
                wall, lat, fwd, busy, tokens = asyncio.run(_run(server, body, clients, args.requests_per_client))
                wall1, *_ = asyncio.run(_run(server, body, 1, n))
                rate, rate1 = body["num_samples"] * n / wall, body["num_samples"] * n / wall1
                p99 = statistics.quantiles(lat, n=100)[98] if len(lat) > 1 else lat[0]
                tag = f"  ({label})" if len(servers) > 1 else ""
                print(f"{clients:>7} | {rate:>7.1f} {tokens / wall:>8.0f} {statistics.median(lat):>7.3f} {p99:>7.3f} | "
                      f"{rate1:>17.1f} | {rate / rate1:>7.2f}x | {fwd / wall:>12.0%} | {busy / wall:>10.0%}{tag}",
                      flush=True)
    finally:
        for _, _, proc in servers:
            proc.terminate()
            proc.wait(timeout=30)
    _forward_bound(Path(args.checkpoints) / info["checkpoint"], args.precision, args.device, tuple(args.clients))


def _sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _forward_bound(checkpoint: Path, precision: str, device: str, clients: tuple[int, ...]) -> None:
    """The most that batching can gain on this machine: the backbone's forward time per sample at the
    batch one request brings (2) against the batch C clients bring (2C), in this process, alone."""
    import torch

    from ttcore.models import load_for_inference

    model, _, _ = load_for_inference(checkpoint, device, precision)
    times = {}
    for b in sorted({2} | {2 * c for c in clients}):  # 2: one request, the bound's reference
        x = torch.full((b, model.cfg.dit.length), model.cfg.dit.mask_id, device=device)
        with model.compute_context():
            for _ in range(3):
                model.features(x)
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(20):
                model.features(x)
            _sync(device)
        times[b] = (time.perf_counter() - t0) / 20
    cells = ", ".join(f"batch {b}: {t * 1e3:.1f} ms" for b, t in times.items())
    bounds = ", ".join(f"{c} clients {times[2] / (times[2 * c] / c):.2f}x" for c in clients if c > 1)
    print(f"forward alone ({cells}); speed-up bound if only the forward counted: {bounds}")


if __name__ == "__main__":
    main()
