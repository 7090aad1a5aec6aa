"""Training throughput of the model presets (``model: size:``) on the current device: tokens/s and MFU
(``ttcore.flops``) of real training steps (the MDLM loss, backward, AdamW), per preset and batch, with
torch.compile off and on, side by side in one run.

    python benchmarks/train_throughput.py                         # CPU: presets s and m, batches 32 and 128
    python benchmarks/train_throughput.py --sizes s m l xl --batches 256 512 --steps 20   # a GPU
    python benchmarks/train_throughput.py --smoke                 # a 1-block toy, eager only (the tests run it)

Shapes are MOSES's (l = 54, v = 24) unless --length / --vocab say otherwise; random tokens (throughput does
not depend on them). Each cell: ``--warmup`` steps (compilation included), then ``--steps`` timed steps
(synchronized on CUDA); bf16 autocast on CUDA and where the CPU has bf16 matmuls (``--precision``).
"""

import argparse
import time

import torch

from ttcore.flops import device_peak, mfu, train_flops_per_token
from ttcore.losses import mdlm_loss
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.recipes import MODEL_SIZES, autocast

SMOKE = dict(hidden_dim=32, cond_dim=16, n_blocks=1, n_heads=2)


def measure(dims: dict, batch: int, length: int, vocab: int, device: torch.device, precision: str, compiled: bool,
            warmup: int, steps: int) -> tuple[int, float, float]:
    """-> (parameters, tokens/s, model FLOPs per token) of ``steps`` timed training steps."""
    torch.manual_seed(0)
    model = JointModel(ModelConfig(DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, **dims)))
    model.to(device).train()
    if compiled:
        model.backbone.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    data = torch.randint(0, vocab, (batch * 4, length), device=device)
    g = torch.Generator(device).manual_seed(0)

    def step(k: int):
        x0 = data[(k % 4) * batch:(k % 4 + 1) * batch]
        with autocast(device, precision):
            loss = mdlm_loss(model, x0, vocab, generator=g)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for k in range(warmup):
        step(k)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for k in range(steps):
        step(k)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    return sum(p.numel() for p in model.parameters()), batch * length * steps / seconds, train_flops_per_token(model)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["s", "m"], choices=list(MODEL_SIZES))
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--length", type=int, default=54)
    ap.add_argument("--vocab", type=int, default=24)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", choices=["off", "on", "both"], default="both")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    peak, source = device_peak(device, args.precision)
    presets = {"smoke": SMOKE} if args.smoke else {name: MODEL_SIZES[name] for name in args.sizes}
    batches = [8] if args.smoke else args.batches
    modes = {"off": [False], "on": [True], "both": [False, True]}["off" if args.smoke else args.compile]
    print(f"torch {torch.__version__}, {device}, {args.precision}, {torch.get_num_threads()} threads; peak "
          f"{peak / 1e12:.3g} TFLOP/s ({source}); l = {args.length}, v = {args.vocab}")
    print(f"{'size':>6} {'params':>8} {'batch':>6} {'compile':>8} | {'tokens/s':>10} {'MFU':>7}")
    for name, dims in presets.items():
        for batch in batches:
            for compiled in modes:
                n, rate, flops = measure(dims, batch, args.length, args.vocab, device, args.precision, compiled,
                                         1 if args.smoke else args.warmup, 2 if args.smoke else args.steps)
                print(f"{name:>6} {n / 1e6:>7.1f}M {batch:>6} {'on' if compiled else 'off':>8} | {rate:>10,.0f} "
                      f"{100 * mfu(rate, flops, peak):>6.2f}%", flush=True)


if __name__ == "__main__":
    main()
