"""Cold start and the start-up calibration's spread: `python -m service` started N times, side by side
with nothing else (or, with --busy, with CPU-burning processes running through each start).

    python benchmarks/cold_start.py                      # bundled checkpoints/, 5 starts
    python benchmarks/cold_start.py --starts 3 --busy 2  # the same with two busy-looping processes
    python benchmarks/cold_start.py --starts 1           # smoke size (the tests run it)

Prints, per start, the seconds from process start to the first 200 from /ready (installs excluded:
the interpreter is already there), and per checkpoint the calibration the server logged (seconds per
sequence: a predetermined step, the chain-rule picks of a whole generation) with its max / min spread
over the starts. The calibration is only where admission starts: finished requests correct it
(``service.admission.Speed``).
"""

import argparse
import multiprocessing
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
LOADED = re.compile(r"loaded (\S+): .*?per sequence: ([\d.]+) s a step .*?about ([\d.]+) s of exact chain-rule picks")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _burn() -> None:
    while True:
        pass


def one_start(checkpoints: str) -> tuple[float, dict[str, tuple[float, float]]]:
    """-> (seconds to ready, {checkpoint: (step s, chain-rule s)})."""
    port = _port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "service", "--checkpoints", checkpoints, "--port", str(port),
                             "--log-level", "info"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        ready = time.perf_counter() - t0
    finally:
        proc.terminate()
        log = proc.communicate(timeout=30)[1]
    return ready, {m.group(1): (float(m.group(2)), float(m.group(3))) for m in LOADED.finditer(log)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default=str(ROOT / "checkpoints"))
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--busy", type=int, default=0, help="CPU-burning processes running through each start")
    args = ap.parse_args()
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.busy)]
    for b in burners:
        b.start()
    try:
        starts = [one_start(args.checkpoints) for _ in range(args.starts)]
    finally:
        for b in burners:
            b.terminate()
    ready = [r for r, _ in starts]
    print(f"{args.starts} starts, {args.busy} busy processes: ready after " + ", ".join(f"{r:.2f}" for r in ready)
          + f" s (median {statistics.median(ready):.2f} s)")
    names = sorted({name for _, cal in starts for name in cal})
    print(f"{'checkpoint':>14} | {'step s (min..max)':>22} {'spread':>7} | "
          f"{'chain-rule s (min..max)':>24} {'spread':>7}")
    for name in names:
        steps = [cal[name][0] for _, cal in starts if name in cal]
        chains = [cal[name][1] for _, cal in starts if name in cal]
        spread = [max(v) / min(v) if min(v) > 0 else float("nan") for v in (steps, chains)]
        print(f"{name:>14} | {min(steps):>10.4f}..{max(steps):<10.4f} {spread[0]:>6.1f}x | "
              f"{min(chains):>11.3f}..{max(chains):<11.3f} {spread[1]:>6.1f}x")


if __name__ == "__main__":
    main()
