"""How much of the device a training run uses: model FLOPs per token and the device's peak, so that a recipe
prints its model FLOPs utilization (MFU) beside its tokens per second.

FLOPs per token of a training step (``train_flops_per_token``): the usual 6N plus attention (Kaplan et al.
2020; PaLM, Chowdhery et al. 2022, App. B), counted as the modules run them: a matmul costs 2 FLOPs per weight
forward, 2 for the gradient of its input and 2 for that of its weight (none for a frozen weight: the 2-layer
head's W), and attention 12 l d per block (QK^T and AV, forward and backward) at sequence length l and width
d. Two stages differ in how often they run:
- every position: the blocks' attention and MLP (``backbone_flops_per_token``);
- every masked position, once per output it makes (``head_flops_per_masked_token``): the base head W (rank 1),
  W' (a 1-layer joint head), W~ then the frozen W on each of its E outputs (a 2-layer head), and the TT's
  contracted-core head. Only masked positions reach the head (``JointModel.head_outputs``), so this stage
  is weighed by the masked fraction, 1/2 in expectation under the log-linear schedule (t ~ U[0, 1]).
A block diffusion model (``DiTConfig.block_size``) trains on [x_t, x_0] (``ttcore.models.block_attention``):
its backbone stage runs on 2l positions per l data tokens, each attending over 2l keys (the block mask leaves
SDPA's dense work as it is), so that stage counts twice its matmuls and four times its attention per token.
The per-sequence modules (adaLN, the time and latent embedders, CP's mixture weights) run once a sequence:
their FLOPs count 1/l per position. The embedding (a lookup) and the losses' elementwise work are left out.
Model FLOPs, not hardware FLOPs: recomputation (activation checkpointing) is not counted.
``tests/test_flops.py`` checks the count against the FLOPs torch's ``FlopCounterMode`` measures in a real
training step, for every head kind and size preset.

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
PER_SEQUENCE = ("adaLN_modulation", "sigma_map", "latent", "recognition")  # backbone modules run once a sequence


def _matmul_flops(layer: nn.Linear) -> int:
    """Forward and backward FLOPs of one row through ``layer``: 2 a weight forward, 2 for the input's gradient,
    2 for the weight's when it trains."""
    return (4 + 2 * layer.weight.requires_grad) * layer.weight.numel()


def _head_matmuls(model) -> list[nn.Linear]:
    """The head's own matmuls that run per masked position (not those it declares ``per_sequence``)."""
    head = model.head
    return [m for name, m in head.named_modules() if isinstance(m, nn.Linear)
            and name.split(".")[0] not in head.per_sequence]


def backbone_flops_per_token(model) -> float:
    """Training FLOPs per position of every stage outside the head stage: the matmuls of the backbone
    (``_matmul_flops``), attention's 12 l d per block, and the per-sequence modules' share (theirs / l: the
    backbone's conditioning, ``PER_SEQUENCE``, and what the head declares ``per_sequence``)."""
    head_stage = {id(m) for m in _head_matmuls(model)} | {id(model.output_layer.linear)}
    once = {id(m) for name in model.head.per_sequence for m in getattr(model.head, name).modules()}
    d = model.cfg.dit
    positions = 2 if d.block_size else 1  # block diffusion trains on [x_t, x_0]: 2l positions per l tokens
    per_position = per_sequence = 0.0
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and id(m) not in head_stage:
            if id(m) in once or any(p in name for p in PER_SEQUENCE):
                per_sequence += _matmul_flops(m) / d.length
            else:
                per_position += _matmul_flops(m)
    return positions * per_position + per_sequence + positions * 12 * d.n_blocks * (positions * d.length) * d.hidden_dim


def head_flops_per_masked_token(model) -> float:
    """Training FLOPs per masked position of the head stage: each of the head's matmuls once per position, and
    the base W once per output it is applied to (rank 1: once; a 2-layer joint head: E times; a 1-layer joint
    head replaces it)."""
    head, w = model.head, model.output_layer.linear
    own = sum(_matmul_flops(m) for m in _head_matmuls(model))
    if w is None:  # a 1-layer joint head replaces W
        return own
    return own + (head.e if model.format.joint_head else 1) * _matmul_flops(w)


def train_flops_per_token(model, masked_fraction: float = 0.5) -> float:
    """Model FLOPs of one training token of ``model`` (a ``JointModel``): the all-position stage plus the head
    stage at ``masked_fraction`` (module docstring)."""
    return backbone_flops_per_token(model) + masked_fraction * head_flops_per_masked_token(model)


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
