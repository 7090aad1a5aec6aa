"""The MDLM objective for joints: rank 1 is MDLM's factorized loss; the TT/CP NLLs and marginals match
the distribution classes; the NELBO is a bound (App. B pairs: tight, where the 1/t-weighted joint NLL
is not); L_C is Eq. 19."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ttcore.decompositions import (
    TTOutputs,
    contracted_core_loss,
    cp_masked_log_prob,
    cp_masked_marginal_log_probs,
    factorized_masked_log_prob,
    tt_masked_log_prob,
    tt_masked_marginal_log_probs,
)
from ttcore.distributions import CP, TensorTrain
from ttcore.losses import forward_mask, mdlm_loss, sample_times
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


def test_contracted_core_loss_is_eq_19():
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


def test_marginal_log_probs_match_the_distributions_marginals():
    x0, x_t, mask = _mask(3)
    m, r = int(mask.sum()), 3
    g = torch.Generator().manual_seed(4)
    x_cond = torch.where(mask, torch.full_like(x_t, -1), x_t)
    core_logits = 3 * torch.randn(m, V, r, r, dtype=torch.float64, generator=g)
    tt = TensorTrain.from_masked(TensorTrain.from_logits(core_logits.unsqueeze(0)).cores[0], x_t, mask)
    want = tt.marginals(x_cond)[mask].gather(-1, x0[mask][:, None]).squeeze(-1).log()
    torch.testing.assert_close(tt_masked_marginal_log_probs(core_logits, x0[mask], mask), want)
    w, f = torch.randn(B, r, dtype=torch.float64, generator=g), torch.randn(m, r, V, dtype=torch.float64, generator=g)
    cp = CP.from_masked(torch.softmax(w, -1), torch.softmax(f, -1), x_t, mask)
    want = cp.marginals(x_cond)[mask].gather(-1, x0[mask][:, None]).squeeze(-1).log()
    torch.testing.assert_close(cp_masked_marginal_log_probs(w, f, x0[mask], mask), want)


class _PerfectPairs(nn.Module):
    """App. B data (N pairs of equal bits, each pair uniform): the exact posterior p(x_M | x_t) as a
    rank-2 TT, for every x_t. A masked odd token draws the pair's bit into the state; a masked even
    token copies the state, or its known odd partner; an odd token with a known even partner copies it."""

    def forward(self, x_t, mask, sigma=None):
        b, l = x_t.shape
        cores = torch.zeros(b, l, 2, 2, 2, dtype=torch.float64)  # [b, l, x, j, k]
        for bi in range(b):
            for i in range(0, l, 2):
                a, c = x_t[bi, i].item(), x_t[bi, i + 1].item()
                if mask[bi, i] and mask[bi, i + 1]:
                    cores[bi, i, 0, :, 0] = cores[bi, i, 1, :, 1] = 0.5  # (x, k) = (bit, bit)
                    cores[bi, i + 1, 0, 0, :] = cores[bi, i + 1, 1, 1, :] = 0.5  # emit the state's bit
                elif mask[bi, i]:
                    cores[bi, i, c, :, :] = 0.5  # copy the known even partner
                elif mask[bi, i + 1]:
                    cores[bi, i + 1, a, :, :] = 0.5  # copy the known odd partner
        return TTOutputs(mask, cores[mask].clamp_min(1e-300).log())


def test_nelbo_is_a_bound_on_app_b_pairs_and_the_joint_weighting_is_not():
    """Per token, true NLL = log 2 / 2 = 0.347. The NELBO integrand per token is t * t * log 2 / t (masked,
    partner masked), so the bound is tight: log 2 / 2. The joint NLL weighted by 1/t gives log 2 / 4."""
    n_pairs, b = 3, 6000
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, 2, (b, n_pairs), generator=g).repeat_interleave(2, 1)  # [b, 2N]
    t = sample_times(b, 1e-3, "cpu", g)
    model = _PerfectPairs()
    out = mdlm_loss(model, x0, 2, generator=g, t=t)
    true_nll = math.log(2) / 2
    assert out["nelbo"].item() == pytest.approx(true_nll, abs=0.01)
    x_t, mask = forward_mask(x0, t, 2, torch.Generator().manual_seed(7))
    joint_weighted = (-model(x_t, mask).log_prob(x0) / t).sum().item() / x0.numel()
    assert joint_weighted == pytest.approx(true_nll / 2, abs=0.01)  # what the old "NELBO" printed
    # the joint NLL scores each masked pair once; the marginals score both of its tokens
    assert out["marginal_nll"].item() > out["nll"].item() + 0.05


def test_marginal_consistency_term_adds_the_marginal_nll_with_its_gradient():
    """``marginal_weight`` w: loss = joint NLL + L_C + w * marginal NLL, and the gradient is that of the sum
    (checked against the two terms' own gradients on a tiny TT model)."""
    torch.manual_seed(0)
    model = JointModel(ModelConfig(DiTConfig(vocab_size=V + 1, out_vocab=V, length=L, hidden_dim=16, cond_dim=8,
                                             n_blocks=1, n_heads=2), decomposition="tt", rank=3))
    x0 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(3))
    t = torch.linspace(0.3, 1.0, B)

    def grads(w):
        model.zero_grad()
        out = mdlm_loss(model, x0, V, generator=torch.Generator().manual_seed(4), t=t, marginal_weight=w)
        out["loss"].backward()
        return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain, g0 = grads(0.0)
    mixed, g1 = grads(0.5)
    torch.testing.assert_close(mixed["loss"], plain["loss"] + 0.5 * plain["marginal_nll"])
    assert not torch.allclose(mixed["marginal_nll"], mixed["nll"])  # a TT's marginals are not its joint
    # d(marginal term)/d(theta) = (g1 - g0) / 0.5 is a real, nonzero gradient
    assert max((a - b).abs().max().item() for a, b in zip(g1, g0)) > 1e-6
