"""Model FLOPs per token and the device's peak (``ttcore.flops``): the count against a hand count from the
config, the table of GPU peaks, a measured CPU peak, and the MFU a recipe records."""

import pytest
import torch

from ttcore.flops import device_peak, gpu_peak, mfu, train_flops_per_token
from ttcore.models import DiTConfig, JointModel, ModelConfig


def _base(d=32, blocks=2, length=10, vocab=7):
    torch.manual_seed(0)
    return JointModel(ModelConfig(DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, hidden_dim=d,
                                            cond_dim=16, n_blocks=blocks, n_heads=2)))


def test_flops_per_token_is_6n_plus_attention_from_the_config():
    """Per block: attention qkv (3 d^2) and out (d^2), the MLP (2 x 4 d^2); the output layer d v; 6 FLOPs a weight;
    attention scores 12 l d per block. The embedding and the per-sequence adaLN are not counted."""
    d, blocks, length, vocab = 32, 2, 10, 7
    base = _base(d, blocks, length, vocab)
    per_token = blocks * 12 * d * d + d * vocab
    assert train_flops_per_token(base) == 6 * per_token + 12 * blocks * length * d
    # a 1-layer TT head replaces the output layer (its projection emits all r^2 x v logits) and runs on the
    # masked positions only: half of them on average
    tt = JointModel.from_base(base, "tt", 3, noise=0.1)
    head = sum(m.weight.numel() for m in tt.head.modules() if isinstance(m, torch.nn.Linear))
    assert head == (9 * vocab + 9) * d  # proj and the contracted-core head
    assert train_flops_per_token(tt) == pytest.approx(train_flops_per_token(base) - 6 * d * vocab + 6 * 0.5 * head)


def test_gpu_peaks_by_name_and_a_measured_cpu_peak():
    assert gpu_peak("NVIDIA H100 80GB HBM3") == 989e12 and gpu_peak("NVIDIA H100 PCIe") == 756e12
    assert gpu_peak("NVIDIA H200") == 989e12 and gpu_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_peak("Some Other Accelerator") is None
    before = torch.get_rng_state()
    peak, source = device_peak(torch.device("cpu"), "fp32")
    assert torch.equal(torch.get_rng_state(), before)  # a recipe's RNG state is untouched (exact resume)
    assert 1e8 < peak < 1e14 and source == "measured cpu float32 matmul peak"
    assert mfu(1000.0, 1e6, 1e10) == pytest.approx(0.1)
