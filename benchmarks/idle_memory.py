"""The serving process's memory after a load of varied request shapes, and once it is idle: with the engine
giving freed memory back when a queue empties (``--release-idle-memory``, the default) beside without it, two
servers started side by side in one run on the bundled checkpoints.

    python benchmarks/idle_memory.py              # 3 rounds of 18 request shapes
    python benchmarks/idle_memory.py --smoke      # 1 round of 4 shapes (the tests run it)

Prints each server's RSS when ready, right after the load, and after ``--idle-s`` seconds of idleness, and the
idle / ready ratio. The load is the kind of traffic a hostile probe sends: every family, 1 to 256 samples, 4 to
64 steps, predetermined and adaptive orderings, streamed and not; the same requests go to both servers.
"""

import argparse
import itertools
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _server import start

ROOT = Path(__file__).resolve().parent.parent


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _start(*flags: str) -> tuple[subprocess.Popen, str]:
    return start([sys.executable, "-m", "service", "--checkpoints", ROOT / "checkpoints", "--log-level", "warning",
                  "--precision", "bf16", *flags], cwd=ROOT, timeout=180)


def shapes(smoke: bool) -> list[dict]:
    if smoke:
        return [dict(model="qm9", num_samples=4, steps=4), dict(model="text", num_samples=2, steps=8),
                dict(model="moses", num_samples=8, steps=8, ordering="top_prob"),
                dict(model="qm9", decomposition="cp", num_samples=16, steps=4, stream=True)]
    out = []
    for model, (n, k), extra in itertools.product(
            ("qm9", "moses", "text"), ((1, 64), (64, 16), (256, 4)),
            ({}, {"ordering": "top_prob", "stream": True})):
        if model == "text" and n == 256:
            n = 32  # what fits the default deadline and stream limit on two cores
        out.append(dict(model=model, num_samples=n, steps=k, seed=n + k, **extra))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    rounds = 1 if args.smoke else args.rounds
    servers = {"release": _start(), "keep": _start("--no-release-idle-memory")}
    try:
        ready = {name: _rss_mb(proc.pid) for name, (proc, _) in servers.items()}
        failures = 0
        for _ in range(rounds):
            for body in shapes(args.smoke):
                for _, url in servers.values():  # the same request to each, one after the other
                    r = httpx.post(url + "/generate", json=body, timeout=600)
                    failures += r.status_code != 200
        loaded = {name: _rss_mb(proc.pid) for name, (proc, _) in servers.items()}
        time.sleep(args.idle_s)
        idle = {name: _rss_mb(proc.pid) for name, (proc, _) in servers.items()}
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    print(f"{rounds} round(s) of {len(shapes(args.smoke))} request shapes to each server ({failures} not 200); "
          f"RSS in MB")
    print(f"{'server':>28} | {'ready':>7} {'loaded':>7} {'idle':>7} | {'idle / ready':>12}")
    for name, label in (("release", "--release-idle-memory"), ("keep", "--no-release-idle-memory")):
        print(f"{label:>28} | {ready[name]:>7.0f} {loaded[name]:>7.0f} {idle[name]:>7.0f} | "
              f"{idle[name] / ready[name]:>11.2f}x")


if __name__ == "__main__":
    main()
