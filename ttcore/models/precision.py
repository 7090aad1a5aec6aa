"""Inference precision: which one to serve in, and the compute context that applies it."""

import contextlib
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``auto``: bf16 where bf16 matmuls are native (a CUDA device that supports them; a CPU with
    AVX512-BF16 or AMX, read from /proc/cpuinfo), fp32 elsewhere. The quality tables are measured in
    bf16; on this project's CPUs bf16 serves 1.3-1.5x the molecules/s of fp32 (README)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "fp32"
    return "bf16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "fp32"


@contextlib.contextmanager
def compute_context(device: torch.device | str, precision: str):
    """Inference mode, and bf16 autocast on ``device``'s type when ``precision`` is bf16 (matmuls in
    bf16; softmaxes, normalizers and sampling stay float32 / float64)."""
    device = torch.device(device)
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        yield


def bucketed_rows(n: int) -> int:
    """``n`` rounded up to one of four sizes per octave (at most 25% more; up to 16 unchanged)."""
    if n <= 16:
        return n
    step = 1 << (n.bit_length() - 3)  # a quarter of the largest power of two <= n
    return -(-n // step) * step


def _bucketed_linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    padded = bucketed_rows(n)
    if padded == n:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    x = torch.cat([x, x.new_zeros((padded - n,) + x.shape[1:])])
    return torch.nn.functional.linear(x, self.weight, self.bias)[:n]


def bucket_linear_rows_(model: torch.nn.Module) -> torch.nn.Module:
    """Pad the leading dimension of every nn.Linear input to ``bucketed_rows`` (zeros, sliced off after).

    oneDNN keeps a primitive (and its reordered weights) per input shape for bf16 matmuls on CPU, so a
    server whose batch sizes vary without end grows without end (measured: a 6M-parameter model went
    from 0.3 to 2.6 GB over random batch sizes 1..256; 4 sizes per octave keep it to a few dozen shapes).
    Rows are independent in a linear layer, so the real rows' outputs are unchanged."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = _bucketed_linear_forward.__get__(module)
    return model
