"""How much of the device a training run uses: model FLOPs per token and the device's peak, so that a recipe
prints its model FLOPs utilization (MFU) beside its tokens per second.

FLOPs per token of a training step (``train_flops_per_token``): the usual 6N plus attention (Kaplan et al.
2020; PaLM, Chowdhery et al. 2022, App. B): 6 FLOPs per weight of every matmul a token passes through
(2 forward, 4 backward) and 12 l d per block for the attention scores and their use (QK^T and AV, forward
and backward) at sequence length l and width d. N counts the weights of the nn.Linear layers applied to
every token (the blocks' attention and MLP, the output layer) and, at the expected masked fraction of the
log-linear schedule (t ~ U[0, 1]: 1/2), those of a joint head, which runs on the masked positions only;
the embedding (a lookup) and the per-sequence conditioning (adaLN, the time and latent embedders) are left
out. Model FLOPs, not hardware FLOPs: recomputation (activation checkpointing) is not counted.

The peak (``device_peak``): a table of dense bf16 tensor-core peaks for known GPUs (vendors' data sheets);
elsewhere, CPUs included, a measured matmul peak in the run's precision (best of a few square matmuls), and
the answer says which.
"""

import functools
import time

import torch
from torch import nn

# dense (no sparsity) bf16 tensor-core peaks, FLOP/s, from the vendors' data sheets; matched in order against
# torch.cuda.get_device_name
GPU_BF16_PEAK = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
                 ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12), ("RTX 4090", 165e12))
PER_SEQUENCE = ("adaLN_modulation", "sigma_map", "latent", "recognition")  # modules run once per sequence


def _linear_weights(module: nn.Module, skip: tuple[str, ...] = PER_SEQUENCE) -> int:
    return sum(m.weight.numel() for name, m in module.named_modules()
               if isinstance(m, nn.Linear) and not any(part in name for part in skip))


def train_flops_per_token(model, masked_fraction: float = 0.5) -> float:
    """Model FLOPs of one training token of ``model`` (a ``JointModel``): 6 N + 12 l d per block (module
    docstring), the joint head's weights at ``masked_fraction``."""
    d = model.cfg.dit
    head = getattr(model, "head", None)
    per_token = _linear_weights(model) - (_linear_weights(head) if head is not None else 0)
    per_masked = _linear_weights(head) if head is not None else 0
    attention = 12 * d.n_blocks * d.length * d.hidden_dim
    return 6 * (per_token + masked_fraction * per_masked) + attention


def gpu_peak(name: str) -> float | None:
    """A known GPU's dense bf16 peak (FLOP/s) by its ``torch.cuda.get_device_name``, or None."""
    return next((peak for key, peak in GPU_BF16_PEAK if key in name), None)


@functools.cache
def _measured_peak(device_type: str, dtype: torch.dtype, size: int = 1024, seconds: float = 0.3) -> float:
    """The best FLOP/s of square ``size`` matmuls in ``dtype`` over about ``seconds``."""
    g = torch.Generator(device_type).manual_seed(0)  # its own stream: a run's RNG state stays the run's
    a = torch.randn(size, size, device=device_type, generator=g).to(dtype)
    b = torch.randn(size, size, device=device_type, generator=g).to(dtype)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        t0 = time.perf_counter()
        (a @ b).sum().item()  # .item(): the product is done
        best = max(best, 2 * size ** 3 / (time.perf_counter() - t0))
    return best


def device_peak(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from) for a run on ``device`` at ``precision`` (bf16 or fp32): a known GPU's
    data-sheet bf16 peak, else a measured matmul peak in that precision."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name)
        if peak is not None:
            return peak, f"{name} dense bf16 data-sheet peak"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    peak = _measured_peak(device.type, dtype)
    return peak, f"measured {device.type} {str(dtype).removeprefix('torch.')} matmul peak"


def mfu(tokens_per_second: float, flops_per_token: float, peak: float) -> float:
    """Model FLOPs utilization: the share of ``peak`` that ``tokens_per_second`` tokens of ``flops_per_token``
    each use."""
    return tokens_per_second * flops_per_token / peak
