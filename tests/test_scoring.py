"""Scoring against brute-force enumeration on a tiny real model: the joint log-probability and the
per-position marginals of a masked set, and the ELBO's Monte Carlo estimate against its exact value
(every mask enumerated, the time integral by quadrature)."""

import itertools
import math

import numpy as np
import pytest
import torch
from explicit import PerfectMarginals
from tiny import tiny_model

from ttcore.scoring import elbo, score

V, L, R = 3, 4, 2


@pytest.mark.parametrize("decomposition", ["none", "cp", "tt"])
def test_score_is_the_enumerated_joint_and_its_marginals(decomposition):
    model = tiny_model(decomposition, V, L, R, perturb=0.5, noise=0.5).double()
    x0 = torch.tensor([[0, 2, 1, 1], [2, 2, 0, 1]])
    mask = torch.tensor([[True, False, True, True], [True, True, True, True]])
    log_prob, token = score(model, x0, mask)
    for b in range(2):
        x_t = torch.where(mask[b], V, x0[b])[None]
        with torch.no_grad():
            joint = model(x_t, mask[b][None]).joint(x_t)
        seqs = torch.tensor(list(itertools.product(range(V), repeat=L)))
        keep = (seqs[:, ~mask[b]] == x0[b, ~mask[b]]).all(1)  # sequences that agree on the known positions
        p = torch.stack([joint.log_prob(s[None]).exp()[0] for s in seqs[keep]]).double()
        assert p.sum().item() == pytest.approx(1.0, abs=1e-6)  # the heads compute in float32
        target = (seqs[keep] == x0[b]).all(1)
        assert log_prob[b].item() == pytest.approx(math.log(p[target].item()), rel=1e-6)
        for i in range(L):
            if mask[b, i]:
                marginal = p[seqs[keep][:, i] == x0[b, i]].sum().item()
                assert token[b, i].item() == pytest.approx(math.log(marginal), rel=1e-5, abs=1e-6)
            else:
                assert math.isnan(token[b, i].item())


@pytest.mark.parametrize("counted", [None, [True, True, False, False]])
def test_elbo_estimate_matches_its_exact_value_within_its_standard_error(counted):
    """``counted``: the real tokens of a sequence cut from a fixed-length block (the last two stand for
    padding: masked and scored by the model like any position, but their terms not counted: ``all_terms``
    False, and the division by the real tokens)."""
    model = tiny_model("tt", V, L, R, perturb=0.5, noise=0.5).double()
    x0 = torch.tensor([[0, 2, 1, 1]])
    masks = torch.tensor(list(itertools.product([False, True], repeat=L)))[1:]  # every nonempty mask
    with torch.no_grad():
        x_t = torch.where(masks, V, x0)
        out = model(x_t, masks)
        per_position = torch.zeros(len(masks), L, dtype=torch.float64)
        per_position[masks] = -out.marginal_log_probs(x0.expand(len(masks), -1)).double()
    keep = torch.ones(L, dtype=torch.bool) if counted is None else torch.tensor(counted)
    loss = per_position[:, keep].sum(1).numpy()  # sum over the masked (counted) set of -log p(x^i | x_t)
    k = masks.sum(1).numpy()
    nodes, weights = np.polynomial.legendre.leggauss(200)
    eps = 1e-3
    t = (nodes + 1) / 2 * (1 - eps) + eps
    w = weights / 2 * (1 - eps)
    # E_M[loss] at time t (an empty mask scores 0), times 1/t, integrated over [eps, 1], per token
    expect = sum(loss[j] * t ** k[j] * (1 - t) ** (L - k[j]) for j in range(len(masks)))
    exact = float((w * expect / t).sum()) / int(keep.sum())
    mean, stderr = elbo(model, x0, num_mc=4000, generator=torch.Generator().manual_seed(0), eps=eps,
                        real=None if counted is None else keep[None], all_terms=counted is None)
    assert abs(mean.item() - exact) < 4 * stderr.item(), (mean.item(), exact, stderr.item())
    assert stderr.item() < 0.05 * exact


class _Oracle(PerfectMarginals):
    """A perfectly trained MDM of a dense joint: its forward gives the exact conditional marginals."""

    def forward(self, x_t, mask, sigma=None):
        return self.head_outputs(self.features(x_t), mask)


def test_the_nelbo_of_a_padded_family_bounds_the_nll_only_with_the_padding_terms():
    """The review: /score's figure over real tokens only is not a bound. A family of two sequences, "A" and
    "AA" (token 1; 0 is [PAD]), each of probability 1/2, so -log p(x) = log 2 = 0.693 nats for each. An exact
    denoiser's NELBO over every position (``all_terms``) equals -log p(x) (every order of the chain rule gives
    it); dropping the padding terms scores "A" at 0 nats: below its NLL, so not a bound."""
    p = torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=torch.float64)  # [00, 01, 10, 11]: only 10 and 11
    oracle = _Oracle(p, 2, 2)
    x0 = torch.tensor([[1, 0], [1, 1]])
    real = torch.tensor([[True, False], [True, True]])
    g = torch.Generator().manual_seed(0)
    full, se = elbo(oracle, x0, num_mc=4000, generator=g, real=real, all_terms=True)
    nll_per_real = torch.tensor([math.log(2) / 1, math.log(2) / 2], dtype=torch.float64)
    assert torch.all((full - nll_per_real).abs() < 4 * se + 1e-3), (full, nll_per_real, se)
    dropped, _ = elbo(oracle, x0, num_mc=400, generator=g, real=real, all_terms=False)
    assert dropped[0].item() < 1e-9 < nll_per_real[0].item()  # "A" scored at 0: not a bound


def test_sequences_draw_their_own_times_so_the_standard_error_over_sequences_covers_the_seed_spread():
    """The review: ``evaluate_likelihood``'s ``elbo_stderr`` was ~8x below the spread of its estimate over
    seeds, because a batch shared its draws of t. With each sequence's own times, the standard error of the
    mean over sequences is at least the seed-to-seed spread (it includes the Monte Carlo noise)."""
    model = tiny_model("tt", V, L, R, perturb=0.5, noise=0.5)
    x0 = torch.randint(0, V, (256, L), generator=torch.Generator().manual_seed(5))  # shared t: spread 3x stderr
    means, stderrs = [], []
    for seed in range(24):
        per_sequence, _ = elbo(model, x0, num_mc=2, generator=torch.Generator().manual_seed(seed))
        means.append(per_sequence.mean().item())
        stderrs.append((per_sequence.std() / len(per_sequence) ** 0.5).item())
    spread, stderr = float(np.std(means, ddof=1)), float(np.mean(stderrs))
    assert spread < 1.5 * stderr, (spread, stderr)
    times = __import__("ttcore.scoring", fromlist=["sequence_times"]).sequence_times(
        4, 3, 1e-3, "cpu", torch.Generator().manual_seed(0))
    assert times.shape == (4, 3) and len({round(v, 9) for v in times[0].tolist()}) == 3  # not shared


def test_a_one_position_masks_joint_and_marginal_agree_under_bf16_autocast():
    """The review: on a bf16 server /score's log_prob and the one masked token's marginal (the same quantity)
    differed by 1.1e-3 nats: the TT's r x r chain products ran in bf16 under autocast. They run in their inputs'
    dtype now (``ttcore.distributions._precision``)."""
    from ttcore.distributions.tensor_train import tt_chain_log_value
    from ttcore.models import prepare_for_inference

    model = prepare_for_inference(tiny_model("tt", V, L, R, perturb=0.5, noise=0.5), "bf16")
    x0 = torch.tensor([[0, 2, 1, 1]])
    worst = 0.0
    for i in range(L):
        mask = torch.zeros_like(x0, dtype=torch.bool)
        mask[0, i] = True
        with model.compute_context():
            log_prob, token = score(model, x0, mask)
        worst = max(worst, abs(log_prob[0].item() - token[0, i].item()))
    assert worst < 1e-5, worst
    mats = torch.rand(1, 6, R, R, generator=torch.Generator().manual_seed(0))  # the products themselves
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = tt_chain_log_value(mats)
        raw = tt_chain_log_value.__wrapped__(mats)  # what autocast made of them before
    assert abs((inside - tt_chain_log_value(mats)).item()) < 1e-6 < abs((raw - inside).item())
