"""CP, Tensor-Train and Factorized joints against brute-force enumeration on tiny V and l."""

import numpy as np
import pytest
import torch
from brute import all_sequences, chi_square_pvalue, conditional, dense_cp, dense_factorized, dense_tt

from ttcore.distributions import CP, Factorized, TensorTrain

L, V, R = 5, 3, 3


def _params(fmt, b=1, l=L, v=V, r=R, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    if fmt == "fact":
        return Factorized.from_logits(2 * torch.randn(b, l, v, generator=g, dtype=dtype))
    if fmt == "cp":
        return CP.from_logits(torch.randn(b, r, generator=g, dtype=dtype),
                              2 * torch.randn(b, l, r, v, generator=g, dtype=dtype))
    if fmt == "tt1":
        r = 1
    return TensorTrain.from_logits(2 * torch.randn(b, l, v, r, r, generator=g, dtype=dtype))


def _dense(dist, seqs):
    s = seqs.numpy()
    if isinstance(dist, Factorized):
        return dense_factorized(dist.probs[0].double().numpy(), s)
    if isinstance(dist, CP):
        return dense_cp(dist.weights[0].double().numpy(), dist.factors[0].double().numpy(), s)
    return dense_tt(dist.cores[0].double().numpy(), s)


def _expand(dist, n):
    if isinstance(dist, Factorized):
        return Factorized(dist.probs.expand(n, -1, -1))
    if isinstance(dist, CP):
        return CP(dist.weights.expand(n, -1), dist.factors.expand(n, -1, -1, -1))
    return TensorTrain(dist.cores.expand(n, -1, -1, -1, -1))


FORMATS = ["fact", "cp", "tt"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_prob_matches_dense_tensor_and_mass_is_one(fmt, dtype):
    dist = _params(fmt, dtype=dtype)
    seqs = all_sequences(L, V)
    dense = _dense(dist, seqs)
    assert dense.sum() == pytest.approx(1.0, abs=1e-5)
    batched = _expand(dist, len(seqs))
    lp = batched.log_prob(seqs)
    assert lp.dtype == dtype
    np.testing.assert_allclose(lp.double().exp().numpy(), dense, rtol=1e-4 if dtype == torch.float32 else 1e-10)


@pytest.mark.parametrize("fmt", FORMATS)
def test_marginals_match_brute_force_conditionals(fmt):
    dist = _params(fmt, seed=1)
    seqs = all_sequences(L, V)
    dense = _dense(dist, seqs)
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        x = torch.randint(0, V, (1, L), generator=g)
        keep = torch.rand(1, L, generator=g) < 0.5
        x_cond = torch.where(keep, x, torch.full_like(x, -1))
        got = dist.marginals(x_cond)[0].numpy()
        want = conditional(dense, seqs.numpy(), x_cond[0].numpy(), V)
        np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("fmt", FORMATS + ["tt1"])
@pytest.mark.parametrize("subset", [None, (0, 2, 3), (4,), (1, 4)])
def test_sample_is_exact_chi_square(fmt, subset):
    n = 20000
    dist = _params(fmt, l=5, seed=2)
    seqs = all_sequences(5, V)
    dense = _dense(dist, seqs)
    cols = list(range(5)) if subset is None else list(subset)
    positions = None
    if subset is not None:
        positions = torch.zeros(n, 5, dtype=torch.bool)
        positions[:, cols] = True
    draws = _expand(dist, n).sample(positions, generator=torch.Generator().manual_seed(11)).numpy()
    off = [i for i in range(5) if i not in cols]
    assert (draws[:, off] == -1).all()
    outcomes = all_sequences(len(cols), V).numpy()
    p = np.array([dense[np.all(seqs.numpy()[:, cols] == o, axis=1)].sum() for o in outcomes])
    assert chi_square_pvalue(draws[:, cols], p, outcomes) > 1e-3


def test_tt_sample_with_different_positions_per_row():
    """One batch, two masks: each half is an exact joint draw of its own subset."""
    n = 20000
    dist = _params("tt", l=5, seed=4)
    seqs = all_sequences(5, V).numpy()
    dense = _dense(dist, torch.from_numpy(seqs))
    positions = torch.zeros(n, 5, dtype=torch.bool)
    positions[: n // 2, [0, 4]] = True
    positions[n // 2:, [1, 2]] = True
    draws = _expand(dist, n).sample(positions, generator=torch.Generator().manual_seed(5)).numpy()
    for rows, cols in ((slice(0, n // 2), [0, 4]), (slice(n // 2, n), [1, 2])):
        outcomes = all_sequences(2, V).numpy()
        p = np.array([dense[np.all(seqs[:, cols] == o, axis=1)].sum() for o in outcomes])
        assert chi_square_pvalue(draws[rows][:, cols], p, outcomes) > 1e-3


def test_sample_chi_square_is_sensitive():
    """The test above can fail: draws from the factorized product of the TT's marginals (the MDM
    approximation) are rejected against the true TT joint."""
    n = 20000
    tt = _params("tt", l=5, seed=2)
    seqs = all_sequences(5, V)
    dense = _dense(tt, seqs)
    marg = tt.marginals(torch.full((1, 5), -1))
    draws = _expand(Factorized(marg), n).sample(generator=torch.Generator().manual_seed(11)).numpy()
    assert chi_square_pvalue(draws, dense, seqs.numpy()) < 1e-6


def test_rank_one_cp_and_tt_equal_factorized():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4, L, V, generator=g, dtype=torch.float64), -1)
    fact = Factorized(probs)
    cp = CP(torch.ones(4, 1, dtype=torch.float64), probs.unsqueeze(2))
    tt = TensorTrain(probs[..., None, None])
    x = torch.randint(0, V, (4, L), generator=g)
    x_cond = torch.where(torch.rand(4, L, generator=g) < 0.4, x, torch.full_like(x, -1))
    for other in (cp, tt):
        torch.testing.assert_close(other.log_prob(x), fact.log_prob(x))
        torch.testing.assert_close(other.marginals(x_cond), fact.marginals(x_cond))


@pytest.mark.parametrize("fmt", ["fact", "cp", "tt"])
def test_from_masked_represents_known_tokens_exactly(fmt):
    """Known positions carry all their mass on the given token; masked ones are the head's joint."""
    b, l = 2, 4
    tokens = torch.tensor([[2, 0, 1, 1], [0, 0, 2, 1]])
    mask = torch.tensor([[True, False, True, False], [False, True, True, True]])
    m = int(mask.sum())
    g = torch.Generator().manual_seed(0)
    if fmt == "fact":
        dist = Factorized.from_masked(torch.softmax(torch.randn(m, V, generator=g, dtype=torch.float64), -1),
                                      tokens, mask)
    elif fmt == "cp":
        w = torch.softmax(torch.randn(b, R, generator=g, dtype=torch.float64), -1)
        f = torch.softmax(torch.randn(m, R, V, generator=g, dtype=torch.float64), -1)
        dist = CP.from_masked(w, f, tokens, mask)
    else:
        logits = torch.randn(m, V, R, R, generator=g, dtype=torch.float64)
        cores = TensorTrain.from_logits(logits.unsqueeze(0)).cores[0]
        dist = TensorTrain.from_masked(cores, tokens, mask)
    seqs = all_sequences(l, V)
    for row in range(b):
        one = _expand(_row(dist, row), len(seqs))
        p = one.log_prob(seqs).exp()
        agree = ((seqs == tokens[row]) | mask[row]).all(1)
        assert p[~agree].abs().max() == 0
        assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
        marg = one.marginals(torch.full((len(seqs), l), -1))[0]
        known = ~mask[row]
        assert torch.equal(marg[known].argmax(-1), tokens[row][known])
        torch.testing.assert_close(marg[known].max(-1).values, torch.ones(int(known.sum()), dtype=marg.dtype))


def _row(dist, row):
    if isinstance(dist, Factorized):
        return Factorized(dist.probs[row:row + 1])
    if isinstance(dist, CP):
        return CP(dist.weights[row:row + 1], dist.factors[row:row + 1])
    return TensorTrain(dist.cores[row:row + 1])


def test_construction_errors_state_the_rule_and_value():
    with pytest.raises(ValueError, match=r"sum to 1 over \(x, k\).*off by"):
        TensorTrain(torch.rand(1, 3, 2, 2, 2))
    with pytest.raises(ValueError, match="square"):
        TensorTrain(torch.rand(1, 3, 2, 2, 3))
    with pytest.raises(ValueError, match=r"shape \[b, l, v, r, r\]"):
        TensorTrain(torch.rand(3, 2, 2, 2))
    with pytest.raises(ValueError, match="nonnegative"):
        Factorized(torch.tensor([[[1.5, -0.5]]]))
    with pytest.raises(TypeError, match="float32 or float64, got torch.float16"):
        Factorized(torch.full((1, 1, 2), 0.5, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"weights must have shape \[b, r\] = \[1, 2\]"):
        CP(torch.ones(1, 3) / 3, torch.full((1, 2, 2, 4), 0.25))
    with pytest.raises(ValueError, match="entries must lie in"):
        _params("tt").log_prob(torch.tensor([[0, 1, 2, 3, 0]]))
    with pytest.raises(ValueError, match="one row per masked position"):
        Factorized.from_masked(torch.full((3, 2), 0.5), torch.zeros(1, 4, dtype=torch.long),
                               torch.tensor([[True, False, False, False]]))


def test_tt_sample_one_position_per_row_at_different_places():
    """The one-position path (prefix products): each row's draw is that position's exact marginal."""
    n = 30000
    dist = _params("tt", l=5, seed=6)
    seqs = all_sequences(5, V).numpy()
    dense = _dense(dist, torch.from_numpy(seqs))
    where = torch.arange(n) % 3 * 2  # positions 0, 2, 4
    positions = torch.nn.functional.one_hot(where, 5).bool()
    draws = _expand(dist, n).sample(positions, generator=torch.Generator().manual_seed(8)).numpy()
    for col in (0, 2, 4):
        rows = where.numpy() == col
        outcomes = np.arange(V)[:, None]
        p = np.array([dense[seqs[:, col] == o].sum() for o in range(V)])
        assert chi_square_pvalue(draws[rows][:, [col]], p, outcomes) > 1e-3
