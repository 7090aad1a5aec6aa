"""App. C: plain RoPE collapses a fully masked input to identical logits at every position."""

import torch

from ttcore.models import DiTConfig, JointModel, ModelConfig


def _model(rotary_values: bool) -> JointModel:
    torch.manual_seed(0)
    cfg = ModelConfig(DiTConfig(vocab_size=9, out_vocab=8, length=7, hidden_dim=32, cond_dim=16, n_blocks=2,
                                n_heads=2, rotary_values=rotary_values))
    model = JointModel(cfg)
    with torch.no_grad():  # zero-initialized modulations and head would make every logit 0 anyway
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def _logits(model, x):
    mask = torch.ones_like(x, dtype=torch.bool)
    return model(x, mask).logits.view(x.shape[0], x.shape[1], -1)  # [b, l, v]


def test_fully_masked_input_collapses_without_value_rotation():
    x = torch.full((2, 7), 8)
    logits = _logits(_model(rotary_values=False), x)
    assert torch.allclose(logits, logits[:, :1].expand_as(logits), atol=1e-5)


def test_value_rotation_distinguishes_positions():
    x = torch.full((2, 7), 8)
    logits = _logits(_model(rotary_values=True), x)
    spread = (logits - logits[:, :1]).abs().amax()
    assert spread > 1e-2


def test_partially_known_input_depends_on_position_either_way():
    x = torch.full((1, 7), 8)
    x[0, 3] = 2
    logits = _logits(_model(rotary_values=False), x)
    assert (logits - logits[:, :1]).abs().amax() > 1e-3
