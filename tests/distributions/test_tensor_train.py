"""Tensor-Train specifics: long chains, the App. B example (its rank facts), the segmented gap products."""

import math

import numpy as np
import pytest
import torch
from brute import all_sequences

from ttcore.distributions import TensorTrain, tt_gap_products, tt_prefix_products, tt_shared_log_prob


def _sequential_log_value(cores: np.ndarray, x: np.ndarray) -> float:
    """float64 left-to-right reference with a rescale after every step."""
    r = cores.shape[-1]
    vec, log_scale = np.ones(r) / r, 0.0
    for i, xi in enumerate(x):
        vec = vec @ cores[i, xi]
        s = vec.max()
        vec, log_scale = vec / s, log_scale + math.log(s)
    return math.log(vec.sum()) + log_scale


def test_log_prob_is_exact_and_finite_for_l_1024_peaked_cores():
    g = torch.Generator().manual_seed(0)
    l, v, r = 1024, 5, 4
    logits = 6 * torch.randn(2, l, v, r, r, generator=g, dtype=torch.float64)
    tt64 = TensorTrain.from_logits(logits)
    x = torch.randint(0, v, (2, l), generator=g)
    ref = np.array([_sequential_log_value(tt64.cores[k].numpy(), x[k].numpy()) for k in range(2)])
    assert np.all(ref < -1000)  # far below float32/float64 underflow without rescaling
    got64 = tt64.log_prob(x).numpy()
    np.testing.assert_allclose(got64, ref, rtol=1e-10)
    got32 = TensorTrain.from_logits(logits.float()).log_prob(x).double().numpy()
    assert np.isfinite(got32).all()
    np.testing.assert_allclose(got32, ref, rtol=1e-4)


def _neighbour_pair_cores(n_pairs: int) -> torch.Tensor:
    """App. B: the rank-2 TT whose cores copy each odd token into its even neighbour."""
    odd = torch.tensor([[[0.5, 0], [0.5, 0]], [[0, 0.5], [0, 0.5]]], dtype=torch.float64)  # [x, j, k]
    even = torch.tensor([[[0.5, 0.5], [0, 0]], [[0, 0], [0.5, 0.5]]], dtype=torch.float64)
    return torch.stack([odd, even] * n_pairs).unsqueeze(0)  # [1, 2N, 2, 2, 2]


def test_neighbour_pairs_is_rank_two_tt_and_needs_cp_rank_two_to_the_n():
    """App. B, by the proof's own facts on the dense tensor P (N = 3 pairs of equal bits):
    - the rank-2 TT of copy cores represents P exactly (log_prob equals the enumeration);
    - every contiguous unfolding A_i (Eq. 11) has rank <= 2: TT ranks (Eq. 12) of 2 suffice;
    - the odd/even flattening (odd positions as rows, even as columns) is the 2^N x 2^N identity up to
      scale, so it has rank 2^N; a CP of rank r has every flattening of rank <= r, so CP needs r >= 2^N."""
    n_pairs = 3
    tt = TensorTrain(_neighbour_pair_cores(n_pairs))
    seqs = all_sequences(2 * n_pairs, 2)
    support = (seqs[:, 0::2] == seqs[:, 1::2]).all(1)
    p = tt.cores.new_zeros(len(seqs))
    p[support] = 2.0 ** -n_pairs
    lp = TensorTrain(tt.cores.expand(len(seqs), -1, -1, -1, -1)).log_prob(seqs)
    torch.testing.assert_close(lp.exp(), p)
    dense = p.reshape((2,) * (2 * n_pairs))  # all_sequences enumerates in C order: P[x1, ..., x2N]
    ranks = [int(torch.linalg.matrix_rank(dense.reshape(2 ** i, -1))) for i in range(1, 2 * n_pairs)]
    assert ranks == [2, 1, 2, 1, 2], ranks  # across a pair: 2; between pairs: 1
    odd_even = dense.permute(*range(0, 2 * n_pairs, 2), *range(1, 2 * n_pairs, 2)).reshape(2 ** n_pairs, -1)
    torch.testing.assert_close(odd_even, torch.eye(2 ** n_pairs, dtype=p.dtype) * 2.0 ** -n_pairs)
    assert int(torch.linalg.matrix_rank(odd_even)) == 2 ** n_pairs
    # the rank facts are not vacuous: a generic (full-rank) tensor of the same shape has larger unfoldings
    generic = torch.rand((2,) * (2 * n_pairs), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert int(torch.linalg.matrix_rank(generic.reshape(8, 8))) == 8


def test_gap_products_match_naive_products():
    g = torch.Generator().manual_seed(1)
    b, l, r = 3, 9, 3
    contracted = torch.softmax(torch.randn(b, l, r, r, generator=g, dtype=torch.float64), -1)
    chosen = torch.rand(b, l, generator=g) < 0.4
    q = tt_gap_products(contracted, chosen)
    for k in range(b):
        for i in range(l):
            start = max([j for j in range(i + 1) if chosen[k, j]], default=0)
            want = torch.eye(r, dtype=torch.float64)
            for j in range(start, i + 1):
                if not chosen[k, j]:
                    want = want @ contracted[k, j]
            torch.testing.assert_close(q[k, i], want)


def test_prefix_products_match_naive_products():
    g = torch.Generator().manual_seed(2)
    b, l, r = 4, 11, 3
    contracted = torch.softmax(torch.randn(b, l, r, r, generator=g, dtype=torch.float64), -1)
    upto = torch.tensor([0, 1, 6, 11])
    p = tt_prefix_products(contracted, upto)
    for k in range(b):
        want = torch.eye(r, dtype=torch.float64)
        for j in range(int(upto[k])):
            want = want @ contracted[k, j]
        torch.testing.assert_close(p[k], want)


def test_shared_log_prob_is_the_batched_log_prob_and_normalized():
    """``tt_shared_log_prob`` (one TT for every row, forward recursion) equals ``TensorTrain.log_prob`` on the
    cores repeated per row, and sums to 1 over all 3^4 sequences."""
    torch.manual_seed(0)
    l, v, r = 4, 3, 5
    cores = TensorTrain.from_logits(3 * torch.randn(1, l, v, r, r, dtype=torch.float64)).cores[0]
    x = all_sequences(l, v)
    shared = tt_shared_log_prob(cores, x)
    batched = TensorTrain(cores.expand(len(x), -1, -1, -1, -1)).log_prob(x)
    torch.testing.assert_close(shared, batched, rtol=0, atol=1e-12)
    assert shared.exp().sum().item() == pytest.approx(1.0, abs=1e-12)
