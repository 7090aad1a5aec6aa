"""Model FLOPs per token and the device's peak (``ttcore.flops``): the count against a hand count from the
config, the table of GPU peaks, a measured CPU peak, and the MFU a recipe records."""

import pytest
import torch

from ttcore.flops import device_peak, gpu_peak, mfu, train_flops_per_token
from ttcore.losses import mdlm_loss
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.recipes import MODEL_SIZES


def _base(d=32, blocks=2, length=10, vocab=7):
    torch.manual_seed(0)
    return JointModel(ModelConfig(DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, hidden_dim=d,
                                            cond_dim=16, n_blocks=blocks, n_heads=2)))


def test_flops_per_token_is_6n_plus_attention_from_the_config():
    """Per block: attention qkv (3 d^2) and out (d^2), the MLP (2 x 4 d^2); the output layer d v, on masked
    positions only; 6 FLOPs a weight; attention scores 12 l d per block; the per-sequence adaLN and time
    embedder 1/l per position. The embedding is not counted."""
    d, blocks, length, vocab = 32, 2, 10, 7
    base = _base(d, blocks, length, vocab)
    per_token = blocks * 12 * d * d + sum(m.weight.numel() for name, m in base.named_modules()
                                          if isinstance(m, torch.nn.Linear) and ("adaLN" in name or "sigma" in name)
                                          ) / length
    assert train_flops_per_token(base) == pytest.approx(6 * per_token + 12 * blocks * length * d + 0.5 * 6 * d * vocab)
    # a 1-layer TT head replaces the output layer (its projection emits all r^2 x v logits) and runs on the
    # masked positions only: half of them on average
    tt = JointModel.from_base(base, "tt", 3, noise=0.1)
    head = sum(m.weight.numel() for m in tt.head.modules() if isinstance(m, torch.nn.Linear))
    assert head == (9 * vocab + 9) * d  # proj and the contracted-core head
    assert train_flops_per_token(tt) == pytest.approx(train_flops_per_token(base) + 0.5 * 6 * (head - d * vocab))
    # a 2-layer head: W~ (E d x d) and the contracted cores (d x r^2) train, the frozen W runs on each of the
    # E = 9 outputs (4 FLOPs a weight: no gradient of its own)
    tt2 = JointModel.from_base(base, "tt", 3, head="2layer", noise=0.1)
    expected = 6 * per_token + 12 * blocks * length * d + 0.5 * (6 * (9 * d * d + 9 * d) + 9 * 4 * d * vocab)
    assert train_flops_per_token(tt2) == pytest.approx(expected)


def _measured_flops_per_token(model, x0: torch.Tensor, mask: torch.Tensor) -> float:
    """FLOPs torch counts in one real training step (the loss's forward and backward) on x0 with ``mask``, per
    position; attention through the math kernel, whose matmuls the counter sees."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    vocab = model.cfg.dit.out_vocab
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        mdlm_loss(model, x0, vocab, t=torch.full((x0.shape[0],), 0.5), mask=mask)["loss"].backward()
    return counter.get_total_flops() / x0.numel()


@pytest.mark.parametrize("size", list(MODEL_SIZES))
@pytest.mark.parametrize("fmt,rank,head", [("none", 1, "1layer"), ("cp", 4, "1layer"), ("cp", 4, "2layer"),
                                           ("tt", 3, "1layer"), ("tt", 3, "2layer")])
def test_flops_per_token_equals_a_measured_training_step(size, fmt, rank, head):
    """The count against torch's FlopCounterMode on a real forward and backward, for every head kind at every
    size preset, with exactly half the positions masked (the count's expected fraction). The per-sequence
    work it leaves out (the embedding, elementwise ops, the TT's r x r chain) is all the difference (measured:
    under 0.02%). Before the head stage was weighed by its
    uses, a 2-layer head was undercounted 0.46x."""
    torch.manual_seed(0)
    length, vocab = 16, 24
    base = JointModel(ModelConfig(DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length,
                                            **MODEL_SIZES[size])))
    model = base if fmt == "none" else JointModel.from_base(base, fmt, rank, head=head, noise=0.1)
    x0 = torch.randint(0, vocab, (2, length))
    mask = (torch.arange(length) % 2 == 0).expand(2, length)
    measured = _measured_flops_per_token(model, x0, mask)
    assert train_flops_per_token(model) / measured == pytest.approx(1.0, abs=0.002)


@pytest.mark.parametrize("fmt,rank", [("none", 1), ("tt", 3)])
def test_flops_per_token_of_a_block_diffusion_model_equal_its_measured_training_step(fmt, rank):
    """BD3-LM's pass over [x_t, x_0]: the backbone on 2l positions, attention over 2l keys, the head on x_t's
    masked half, against FlopCounterMode on a real step of ``block_diffusion_loss``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from ttcore.losses import block_diffusion_loss

    torch.manual_seed(0)
    length, vocab = 16, 24
    dit = DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, block_size=4, **MODEL_SIZES["s"])
    model = JointModel(ModelConfig(dit, fmt, rank, "1layer"))
    x0 = torch.randint(0, vocab, (2, length))
    mask = (torch.arange(length) % 2 == 0).expand(2, length)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        block_diffusion_loss(model, x0, vocab, t=torch.full((2, 4), 0.5), mask=mask)["loss"].backward()
    measured = counter.get_total_flops() / x0.numel()
    assert train_flops_per_token(model) / measured == pytest.approx(1.0, abs=0.002)


def test_flops_per_token_of_a_text_size_rank_1_model():
    """GPT-2's vocabulary: the base head W (768 x 50,257) is most of a small model's weights and runs on the
    masked positions only; counting it on every position overcounted such a model 1.17x."""
    torch.manual_seed(0)
    length, vocab = 32, 50257
    model = JointModel(ModelConfig(DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, hidden_dim=256,
                                             cond_dim=64, n_blocks=2, n_heads=4)))
    x0 = torch.randint(0, vocab, (1, length))
    mask = (torch.arange(length) % 2 == 1)[None]
    assert train_flops_per_token(model) / _measured_flops_per_token(model, x0, mask) == pytest.approx(1.0, abs=0.002)


def test_gpu_peaks_by_name_and_a_measured_cpu_peak():
    assert gpu_peak("NVIDIA H100 80GB HBM3") == 989e12 and gpu_peak("NVIDIA H100 PCIe") == 756e12
    assert gpu_peak("NVIDIA H200") == 989e12 and gpu_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_peak("Some Other Accelerator") is None
    before = torch.get_rng_state()
    peak, source = device_peak(torch.device("cpu"), "fp32")
    assert torch.equal(torch.get_rng_state(), before)  # a recipe's RNG state is untouched (exact resume)
    assert 1e8 < peak < 1e14 and source == "measured cpu float32 matmul peak"
    assert mfu(1000.0, 1e6, 1e10) == pytest.approx(0.1)
