"""Soak: concurrent streaming clients for minutes, against the embedded server and then Ray Serve.

    python benchmarks/soak.py                                   # 64 clients, 10 minutes each mode
    python benchmarks/soak.py --clients 64 --minutes 3 --modes embedded
    python benchmarks/soak.py --clients 2 --minutes 0.1         # smoke size (the tests run it)

Each client streams requests back to back (QM9, 2 molecules, 8 steps, random order; every event read).
Reports errors (a non-200, a broken stream or an `error` event; must be 0), p50/p99 latency and time to
first event, and the serving process's RSS after a warm-up minute (a tenth of the run) and at the end:
growth must stay under 5%. Under Ray Serve the RSS is the replica's (the process that runs the model).
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _server import start

from service.deployment import replica_pids

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "qm9", "num_samples": 2, "steps": 8, "ordering": "random", "stream": True}


def _rss_mb(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


async def _client(http, url, stop_at, stats):
    while time.perf_counter() < stop_at:
        t0, first, ok = time.perf_counter(), None, False
        try:
            async with http.stream("POST", url + "/generate", json=BODY) as r:
                if r.status_code != 200:
                    stats["errors"].append(f"HTTP {r.status_code}")
                    continue
                event = None
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        first = first or time.perf_counter() - t0
                        if event == "error":
                            stats["errors"].append(json.loads(line[6:]).get("error", "error event"))
                        ok = ok or event == "done"
            if not ok:
                stats["errors"].append("stream ended without done")
        except httpx.HTTPError as e:
            stats["errors"].append(type(e).__name__)
            continue
        if ok:
            stats["latency"].append(time.perf_counter() - t0)
            stats["first"].append(first)


async def _soak(url, clients, seconds, pids_fn):
    stats = {"errors": [], "latency": [], "first": []}
    rss = {}
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients + 4)) as http:
        start = time.perf_counter()
        stop_at = start + seconds

        async def sample_rss():  # every tenth of the run; "warm" is after the first tenth
            rss["series"] = []
            for k in range(1, 11):
                await asyncio.sleep(max(0.0, start + k * seconds / 10 - 0.5 - time.perf_counter()))
                rss["series"].append(round(_rss_mb(pids_fn())))
            rss["warm"], rss["end"] = rss["series"][0], rss["series"][-1]

        await asyncio.gather(sample_rss(), *[_client(http, url, stop_at, stats) for _ in range(clients)])
    return stats, rss


def _report(mode, clients, minutes, stats, rss) -> bool:
    lat, first = stats["latency"], stats["first"]
    def q(xs, p):
        return (statistics.quantiles(xs, n=100)[p - 1] if len(xs) > 1 else (xs[0] if xs else float("nan")))
    growth = (rss["end"] - rss["warm"]) / rss["warm"] if rss.get("warm") else float("nan")
    print(f"{mode:>8} | {clients:>7} {minutes:>5.1f} | {len(lat):>8} {len(stats['errors']):>6} | "
          f"{q(lat, 50):>6.2f} {q(lat, 99):>6.2f} | {q(first, 50):>6.2f} {q(first, 99):>6.2f} | "
          f"{rss.get('warm', 0):>8.0f} {rss.get('end', 0):>8.0f} {growth:>+7.1%}", flush=True)
    print(f"         RSS MB every tenth of the run: {rss.get('series')}")
    if stats["errors"]:
        print(f"         errors (first 5): {stats['errors'][:5]}")
    return not stats["errors"] and growth < 0.05


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default=str(ROOT / "checkpoints"))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--modes", nargs="+", default=["embedded", "ray"], choices=["embedded", "ray"])
    args = ap.parse_args()
    print(f"{args.clients} streaming clients, 2 molecules x 8 steps per request, back to back")
    print(f"{'mode':>8} | {'clients':>7} {'min':>5} | {'requests':>8} {'errors':>6} | {'p50 s':>6} {'p99 s':>6} | "
          f"{'TTFE50':>6} {'TTFE99':>6} | {'RSS warm':>8} {'RSS end':>8} {'growth':>7}")
    passed = True
    for mode in args.modes:
        env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
        if mode == "embedded":
            cmd = [sys.executable, "-m", "service", "--checkpoints", args.checkpoints, "--log-level", "warning"]
        else:
            app = json.dumps({"checkpoints": str(Path(args.checkpoints).resolve()), "threads": 1})
            cmd = [sys.executable, "-m", "service.deployment", "--args", app]
        proc, url = start(cmd, cwd=ROOT, env=env, poll=0.5, start_new_session=True)
        try:
            pids = (lambda: [proc.pid]) if mode == "embedded" else replica_pids
            stats, rss = asyncio.run(_soak(url, args.clients, 60 * args.minutes, pids))
            passed &= _report(mode, args.clients, args.minutes, stats, rss)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
    print("PASS: no errors, RSS growth under 5%" if passed else "FAIL: errors or RSS growth of 5% or more")


if __name__ == "__main__":
    main()
