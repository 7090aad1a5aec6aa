"""The TT predetermined step of a real JointModel (its softmax heads, not an explicit stand-in):
``contraction="head"`` draws from the joint its contracted-core head implies, ``"exact"`` from the TT's
own marginal of x_T, and a temperature other than 1 always uses the tempered train's exact sums.
Each reference is enumerated in numpy from the model's raw outputs; chi-square at fixed seeds."""

import itertools

import numpy as np
import pytest
import torch
from brute import chi_square_pvalue
from tiny import tiny_model

from ttcore.sampling import predetermined_step

V, L, R, N = 3, 6, 2, 20000
T = [1, 4]  # chosen positions; 0 is known; 2, 3, 5 are masked and summed out


def _model():
    model = tiny_model("tt", V, L, R, perturb=0.5, noise=0.5)
    with torch.no_grad():  # an untrained head predicts uniform Gbar; make it a wrong guess instead
        model.head.contracted.weight.normal_(0, 2.0)
    return model


def _setting(model):
    x = torch.full((1, L), V)
    x[0, 0] = 1
    masked = x == V
    chosen = torch.zeros(1, L, dtype=torch.bool)
    chosen[0, T] = True
    with torch.no_grad():
        h = model.features(x)  # [1, l, d]
    return x, masked, chosen, h


def _reference(model, h, masked, temperature, contraction) -> tuple[np.ndarray, np.ndarray]:
    """p(x_T) = (1/r) 1^T M_1 .. M_l 1 / Z by enumeration: M = G_i(x^i) on T (cores row-normalized by
    hand from the raw logits), Gbar on the other masked positions (the head's, or sum_x G), I on known. At
    T != 1 the tempered train: every entry G_i(x, j, k)^(1/T), rows no longer normalized (docs: concepts)."""
    with torch.no_grad():
        logits = model.head.core_logits(h[0]).double().numpy()  # [l, v, r, r]
        head_bar = model.head.contracted_cores(h[0]).double().numpy()  # [l, r, r]
    cores = np.zeros_like(logits)
    for i in range(L):
        for j in range(R):
            row = np.exp(logits[i, :, j, :] - logits[i, :, j, :].max())
            cores[i, :, j, :] = (row / row.sum()) ** (1 / temperature)
    outcomes = np.array(list(itertools.product(range(V), repeat=len(T))))
    p = np.zeros(len(outcomes))
    for n, xs in enumerate(outcomes):
        vec = np.ones(R) / R
        for i in range(L):
            if i in T:
                mat = cores[i, xs[T.index(i)]]
            elif masked[0, i]:
                mat = head_bar[i] if contraction == "head" else cores[i].sum(0)
            else:
                mat = np.eye(R)
            vec = vec @ mat
        p[n] = vec.sum()
    return p / p.sum(), outcomes


def _draws(model, x, masked, chosen, h, temperature, contraction, seed=0) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        values = predetermined_step(model, h.expand(N, -1, -1), x.expand(N, -1), masked.expand(N, -1),
                                    chosen.expand(N, -1), temperature, g, contraction)
    assert (values[:, T] >= 0).all() and (values[:, [0, 2, 3, 5]] == -1).all()
    return values[:, T].numpy()


def test_head_path_draws_from_the_joint_its_head_implies():
    model = _model()
    x, masked, chosen, h = _setting(model)
    p_head, outcomes = _reference(model, h, masked, 1.0, "head")
    p_exact, _ = _reference(model, h, masked, 1.0, "exact")
    assert np.abs(p_head - p_exact).sum() / 2 > 0.05  # the two joints differ: the test can tell them apart
    draws = _draws(model, x, masked, chosen, h, 1.0, "head")
    assert chi_square_pvalue(draws, p_head, outcomes) > 1e-3
    assert chi_square_pvalue(draws, p_exact, outcomes) < 1e-6


def test_exact_contraction_draws_from_the_tt_marginal():
    model = _model()
    x, masked, chosen, h = _setting(model)
    p_exact, outcomes = _reference(model, h, masked, 1.0, "exact")
    draws = _draws(model, x, masked, chosen, h, 1.0, "exact", seed=1)
    assert chi_square_pvalue(draws, p_exact, outcomes) > 1e-3


@pytest.mark.parametrize("contraction", ["head", "exact"])
def test_temperature_uses_the_tempered_cores_exact_sum(contraction):
    model = _model()
    x, masked, chosen, h = _setting(model)
    p_tempered, outcomes = _reference(model, h, masked, 0.5, "exact")
    p_untempered_head, _ = _reference(model, h, masked, 1.0, "head")
    draws = _draws(model, x, masked, chosen, h, 0.5, contraction, seed=2)
    assert chi_square_pvalue(draws, p_tempered, outcomes) > 1e-3
    assert np.abs(p_tempered - p_untempered_head).sum() / 2 > 0.05


def test_unknown_contraction_is_refused():
    model = _model()
    x, masked, chosen, h = _setting(model)
    with pytest.raises(ValueError, match="contraction must be one of"):
        predetermined_step(model, h, x, masked, chosen, 1.0, None, "approximate")
