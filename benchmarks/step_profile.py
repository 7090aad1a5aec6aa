"""Where one engine step's time goes, in process (no HTTP): C requests of 2 molecules x 8 steps, random
order, stepped together as the service's continuous batching steps them (``batch_step``), for each C given.

    python benchmarks/step_profile.py --clients 1 8 32             # CPU, bundled qm9-tt-r16
    python benchmarks/step_profile.py --device cuda --precision bf16 --clients 1 8 32 64
    python benchmarks/step_profile.py --clients 1 2 --rounds 1     # smoke size (the tests run it)
    python benchmarks/step_profile.py --baseline-tree /tmp/before  # and the ops of another checkout (git worktree)

Prints, for each client count, per step (device synchronized at each boundary): the backbone forward, the
rest of the step (heads and the joint draws), and the copy of every request's tokens to the host; then a line
``clients C: ops per step N`` (aten operators dispatched per engine step, nested ones included, counted by
torch.profiler over one round; on CUDA also kernel launches per step) and its ratio to the first client
count; then torch.profiler's operators by self time at the last count, so a GPU lease can see what to fix.
"""

import argparse
import os
import subprocess
import sys
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


def one_round(model, runs: list[GenerationRun], device: torch.device, forward=None) -> dict[str, float]:
    """Step ``runs`` together until done (``forward``: the engine's ForwardGraphs on CUDA); -> seconds in each
    phase, summed over the steps."""
    spent = {"forward": 0.0, "heads and draws": 0.0, "copy to host": 0.0, "steps": 0}

    with model.compute_context():
        while live := [run for run in runs if not run.done]:
            _sync(device)
            t0 = time.perf_counter()
            done = batch_step(model, live, forward) if forward is not None else batch_step(model, live)
            spent["forward"] += done.forward_seconds
            _sync(device)
            t1 = time.perf_counter()
            if hasattr(done, "tokens"):  # as the engine copies them: one tensor each
                done.tokens.cpu(), done.committed.cpu()
            else:  # a baseline checkout from before the batched step
                torch.cat([s.tokens for s in done.states]).cpu(), torch.cat([s.committed for s in done.states]).cpu()
            t2 = time.perf_counter()
            spent["steps"] += 1
            spent["copy to host"] += t2 - t1
            spent["heads and draws"] += (t1 - t0)
    spent["heads and draws"] -= spent["forward"]
    return spent


def dispatched(model, clients: int, device: torch.device, forward=None) -> tuple[dict[str, float], object]:
    """Over one round: aten operators (and CUDA kernel launches) per engine step, and the profile. The requests
    are made before the profile starts: what a request costs once, when it arrives, is not a step's."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    runs = requests(model, clients, device, seed=7)
    with torch.profiler.profile(activities=activities) as prof:
        steps = one_round(model, runs, device, forward)["steps"]
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
    ap.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=None,
                    help="the forward as the engine runs it: padded and CUDA-graph replayed (default: on CUDA)")
    ap.add_argument("--compile-streams", action=argparse.BooleanOptionalAction, default=None,
                    help="the random streams drawn through torch.compile, as the engine does (default: on CUDA)")
    ap.add_argument("--baseline-tree", default=None, help="another checkout whose ops per step are counted too")
    args = ap.parse_args()
    device = torch.device(args.device)
    model, _, _ = load_for_inference(Path(args.checkpoint), device, args.precision)
    forward = None
    if args.graphs if args.graphs is not None else device.type == "cuda":
        from ttcore.sampling.graphs import ForwardGraphs

        forward = ForwardGraphs(model)
    compiled = args.compile_streams if args.compile_streams is not None else device.type == "cuda"
    if compiled:
        from ttcore.distributions.streams import compile_streams, warm_streams

        compile_streams(device.type)
        warm_streams(device)
    base, prof = None, None
    for clients in args.clients:
        one_round(model, requests(model, clients, device, seed=0), device, forward)  # warm-up (and captures)
        total = {}
        for r in range(args.rounds):
            for k, v in one_round(model, requests(model, clients, device, seed=100 * (r + 1)), device,
                                  forward).items():
                total[k] = total.get(k, 0.0) + v
        steps = total.pop("steps")
        whole = sum(total.values())
        print(f"{Path(args.checkpoint).name}, {clients} requests x 2 molecules x 8 steps, {args.precision}, "
              f"{device}{', CUDA graphs' if forward is not None and forward.capture else ''}"
              f"{', compiled streams' if compiled else ''}; per batched "
              f"step ({steps:.0f} steps):")
        for k, v in total.items():
            print(f"  {k:>16}: {v / steps * 1e3:7.2f} ms  ({v / whole:.0%})")
        counted, prof = dispatched(model, clients, device, forward)
        base = base or counted
        extra = f", kernel launches per step {counted['launches']:.0f}" if "launches" in counted else ""
        print(f"clients {clients}: ops per step {counted['ops']:.0f}{extra} "
              f"({counted['ops'] / base['ops']:.2f}x the count at {args.clients[0]} clients)", flush=True)
    if args.baseline_tree:  # this script, on the other checkout's ttcore, eager, without its profile table
        tree = Path(args.baseline_tree).resolve()
        done = subprocess.run([sys.executable, __file__, "--checkpoint", args.checkpoint, "--device", args.device,
                               "--precision", args.precision, "--clients", *map(str, args.clients), "--rounds",
                               str(args.rounds), "--top", "0", "--no-graphs"], cwd=tree,
                              env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True, check=True)
        print(f"baseline {tree} (the same script on its ttcore):")
        print(done.stdout.rstrip())
    if not args.top:
        return
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.top, max_name_column_width=48))
    if device.type == "cuda":
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top,
                                        max_name_column_width=48))


if __name__ == "__main__":
    main()
