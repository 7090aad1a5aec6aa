"""Where one engine step's time goes, in process (no HTTP): C requests of 2 molecules x 8 steps, random
order, stepped together as the service's continuous batching steps them (``batch_step``), for each C given.

    python benchmarks/step_profile.py --clients 1 8 32             # CPU, bundled qm9-tt-r16
    python benchmarks/step_profile.py --device cuda --precision bf16 --clients 1 8 32 64
    python benchmarks/step_profile.py --clients 1 2 --rounds 1     # smoke size (the tests run it)

Prints, for each client count, per step (device synchronized at each boundary): the backbone forward, the
rest of the step (heads and the joint draws), and the copy of every request's tokens to the host; then a line
``clients C: ops per step N`` (aten operators dispatched per engine step, nested ones included, counted by
torch.profiler over one round; on CUDA also kernel launches per step) and its ratio to the first client
count; then torch.profiler's operators by self time at the last count, so a GPU lease can see what to fix.
"""

import argparse
import time
from pathlib import Path

import torch

from ttcore.models import load_for_inference
from ttcore.sampling import GenerationRun
from ttcore.sampling.generate import batch_step

ROOT = Path(__file__).resolve().parent.parent


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def requests(model, clients: int, device: torch.device, seed: int) -> list[GenerationRun]:
    """``clients`` requests as the service makes them when they arrive (before any step)."""
    return [GenerationRun(model, 2, 8, seed=seed + i, device=device) for i in range(clients)]  # random order


def one_round(model, runs: list[GenerationRun], device: torch.device) -> dict[str, float]:
    """Step ``runs`` together until done; -> seconds in each phase, summed over the steps."""
    spent = {"forward": 0.0, "heads and draws": 0.0, "copy to host": 0.0, "steps": 0}

    with model.compute_context():
        while live := [run for run in runs if not run.done]:
            _sync(device)
            t0 = time.perf_counter()
            done = batch_step(model, live)
            spent["forward"] += done.forward_seconds
            _sync(device)
            t1 = time.perf_counter()
            done.tokens.cpu(), done.committed.cpu()  # as the engine copies them: one tensor each
            t2 = time.perf_counter()
            spent["steps"] += 1
            spent["copy to host"] += t2 - t1
            spent["heads and draws"] += (t1 - t0)
    spent["heads and draws"] -= spent["forward"]
    return spent


def dispatched(model, clients: int, device: torch.device) -> tuple[dict[str, float], object]:
    """Over one round: aten operators (and CUDA kernel launches) per engine step, and the profile. The requests
    are made before the profile starts: what a request costs once, when it arrives, is not a step's."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    runs = requests(model, clients, device, seed=7)
    with torch.profiler.profile(activities=activities) as prof:
        steps = one_round(model, runs, device)["steps"]
    events = prof.events()
    out = {"ops": sum(e.name.startswith("aten::") for e in events) / steps}
    if device.type == "cuda":
        out["launches"] = sum(e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
                              for e in events) / steps
    return out, prof


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "qm9-tt-r16"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    ap.add_argument("--top", type=int, default=15, help="operators listed from the profile")
    args = ap.parse_args()
    device = torch.device(args.device)
    model, _, _ = load_for_inference(Path(args.checkpoint), device, args.precision)
    base, prof = None, None
    for clients in args.clients:
        one_round(model, requests(model, clients, device, seed=0), device)  # warm-up
        total = {}
        for r in range(args.rounds):
            for k, v in one_round(model, requests(model, clients, device, seed=100 * (r + 1)), device).items():
                total[k] = total.get(k, 0.0) + v
        steps = total.pop("steps")
        whole = sum(total.values())
        print(f"{Path(args.checkpoint).name}, {clients} requests x 2 molecules x 8 steps, {args.precision}, "
              f"{device}; per batched step ({steps:.0f} steps):")
        for k, v in total.items():
            print(f"  {k:>16}: {v / steps * 1e3:7.2f} ms  ({v / whole:.0%})")
        counted, prof = dispatched(model, clients, device)
        base = base or counted
        extra = f", kernel launches per step {counted['launches']:.0f}" if "launches" in counted else ""
        print(f"clients {clients}: ops per step {counted['ops']:.0f}{extra} "
              f"({counted['ops'] / base['ops']:.2f}x the count at {args.clients[0]} clients)")
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.top, max_name_column_width=48))
    if device.type == "cuda":
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top,
                                        max_name_column_width=48))


if __name__ == "__main__":
    main()
