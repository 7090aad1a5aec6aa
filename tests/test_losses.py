"""The MDLM objective for joints: rank 1 is MDLM's factorized loss; the TT/CP NLLs match the
distribution classes; L_C is Eq. 21."""

import pytest
import torch
import torch.nn.functional as F

from ttcore.distributions import CP, TensorTrain
from ttcore.losses import (contracted_core_loss, cp_masked_log_prob, factorized_masked_log_prob,
                           forward_mask, mdlm_loss, tt_masked_log_prob)
from ttcore.models import DiTConfig, JointModel, ModelConfig

V, L, B = 7, 6, 5


def _mask(seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(0, V, (B, L), generator=g)
    x_t, mask = forward_mask(x0, torch.linspace(0.2, 1.0, B), V, g)
    return x0, x_t, mask


def test_rank_one_joint_nll_equals_factorized_nll():
    x0, _, mask = _mask()
    m = int(mask.sum())
    logits = torch.randn(m, V, 1, 1, dtype=torch.float64)
    targets = x0[mask]
    fact = factorized_masked_log_prob(logits[..., 0, 0], targets, mask)
    torch.testing.assert_close(tt_masked_log_prob(logits, targets, mask), fact)
    torch.testing.assert_close(cp_masked_log_prob(torch.zeros(B, 1, dtype=torch.float64),
                                                  logits[..., 0, 0].unsqueeze(1), targets, mask), fact)


def test_joint_nll_matches_distribution_log_prob():
    x0, x_t, mask = _mask(1)
    m, r = int(mask.sum()), 3
    g = torch.Generator().manual_seed(2)
    core_logits = torch.randn(m, V, r, r, dtype=torch.float64, generator=g)
    cores = TensorTrain.from_logits(core_logits.unsqueeze(0)).cores[0]
    tt = TensorTrain.from_masked(cores, x_t, mask)
    torch.testing.assert_close(tt_masked_log_prob(core_logits, x0[mask], mask), tt.log_prob(x0))
    w, f = torch.randn(B, r, dtype=torch.float64, generator=g), torch.randn(m, r, V, dtype=torch.float64, generator=g)
    cp = CP.from_masked(torch.softmax(w, -1), torch.softmax(f, -1), x_t, mask)
    torch.testing.assert_close(cp_masked_log_prob(w, f, x0[mask], mask), cp.log_prob(x0))


def test_mdlm_loss_of_base_model_equals_hand_written_mdlm_loss():
    torch.manual_seed(0)
    model = JointModel(ModelConfig(DiTConfig(vocab_size=V + 1, out_vocab=V, length=L, hidden_dim=16,
                                             cond_dim=8, n_blocks=1, n_heads=2)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x0 = torch.randint(0, V, (B, L))
    t = torch.linspace(0.1, 0.9, B)
    out = mdlm_loss(model, x0, V, generator=torch.Generator().manual_seed(5), t=t)
    x_t, mask = forward_mask(x0, t, V, torch.Generator().manual_seed(5))
    logits = model.output_layer.linear(model.features(x_t))  # [b, l, v]
    ce = F.cross_entropy(logits.transpose(1, 2), x0, reduction="none") * mask  # [b, l]
    assert out["nll"].item() == pytest.approx((ce.sum() / mask.sum()).item(), rel=1e-5)
    assert out["nelbo"].item() == pytest.approx(((ce.sum(1) / t).sum() / (B * L)).item(), rel=1e-5)
    joint = JointModel.from_base(model, "tt", 1, "1layer", noise=0.3)
    out1 = mdlm_loss(joint, x0, V, generator=torch.Generator().manual_seed(5), t=t)
    logits1 = joint.head.proj(joint.features(x_t))
    ce1 = F.cross_entropy(logits1.transpose(1, 2), x0, reduction="none") * mask
    assert out1["nll"].item() == pytest.approx((ce1.sum() / mask.sum()).item(), rel=1e-5)


def test_contracted_core_loss_is_eq_21():
    g = torch.Generator().manual_seed(0)
    m, r = 4, 3
    core_logits = torch.randn(m, V, r, r, dtype=torch.float64, generator=g)
    pred_logits = torch.randn(m, r, r, dtype=torch.float64, generator=g)
    cores = TensorTrain.from_logits(core_logits.unsqueeze(0)).cores[0]
    want = ((torch.softmax(pred_logits, -1) - cores.sum(1)) ** 2).sum((-2, -1)).mean()
    torch.testing.assert_close(contracted_core_loss(pred_logits, core_logits), want)
    exact = cores.sum(1).log()
    assert contracted_core_loss(exact, core_logits).item() == pytest.approx(0.0, abs=1e-20)
    core_logits.requires_grad_(True)
    pred_logits.requires_grad_(True)
    contracted_core_loss(pred_logits, core_logits).backward()
    assert pred_logits.grad.abs().max() > 0
    assert core_logits.grad is None  # stopgrad on the target
