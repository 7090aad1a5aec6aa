"""Cold start: `python -m service` started N times, side by side with nothing else (or, with --busy, with
CPU-burning processes running through each start), and each server's first requests.

    python benchmarks/cold_start.py                      # bundled checkpoints/, 5 starts
    python benchmarks/cold_start.py --starts 3 --busy 2  # the same with two busy-looping processes
    python benchmarks/cold_start.py --starts 1           # smoke size (the tests run it)

Prints, per start, the seconds from process start to the first 200 from /ready (installs excluded: the
interpreter is already there), then, with the burners stopped, the seconds of the first request of each
bundled family (4 samples, 8 steps, random order: it times its kind of work, ``service.speed.Speed``)
and of the same request again.
"""

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import httpx
from _server import start

ROOT = Path(__file__).resolve().parent.parent


def _burn() -> None:
    while True:
        pass


FAMILIES = ("qm9", "moses", "text")


def one_start(checkpoints: str, burners: list) -> tuple[float, dict[str, tuple[float, float]]]:
    """Start a server while ``burners`` run; once it is ready, stop them and time each family's first request
    and the same request again. -> (seconds to ready, {family: (first s, again s)})."""
    for b in burners:
        b.start()
    t0 = time.perf_counter()
    try:
        proc, url = start([sys.executable, "-m", "service", "--checkpoints", checkpoints, "--log-level", "warning"],
                          cwd=ROOT, poll=0.02)
        ready = time.perf_counter() - t0
    finally:
        for b in burners:
            b.terminate()
            b.join()
    try:
        served = {m["model"] for m in httpx.get(url + "/models").json()["models"]}
        firsts = {}
        for family in (f for f in FAMILIES if f in served):
            times = []
            for _ in range(2):
                t = time.perf_counter()
                r = httpx.post(url + "/generate", json={"model": family, "num_samples": 4, "steps": 8, "seed": 0},
                               timeout=300)
                if r.status_code != 200:
                    raise SystemExit(f"{family}: {r.status_code} {r.text[:300]}")
                times.append(time.perf_counter() - t)
            firsts[family] = (times[0], times[1])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return ready, firsts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default=str(ROOT / "checkpoints"))
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--busy", type=int, default=0, help="CPU-burning processes running through each start")
    args = ap.parse_args()
    starts = [one_start(args.checkpoints, [multiprocessing.Process(target=_burn, daemon=True)
                                           for _ in range(args.busy)]) for _ in range(args.starts)]
    ready = [r for r, _ in starts]
    print(f"{args.starts} starts, {args.busy} busy processes: ready after " + ", ".join(f"{r:.2f}" for r in ready)
          + f" s (median {statistics.median(ready):.2f} s)")
    print(f"{'family':>8} | {'first request s (each start)':>30} | {'the same again s':>18}")
    for family in FAMILIES:
        rows = [firsts[family] for _, firsts in starts if family in firsts]
        if rows:
            print(f"{family:>8} | {', '.join(f'{a:.2f}' for a, _ in rows):>30} | "
                  f"{', '.join(f'{b:.2f}' for _, b in rows):>18}")


if __name__ == "__main__":
    main()
