"""Tensor-Train specifics: long chains, the App. B example, the segmented gap products."""

import math

import numpy as np
import torch

from brute import all_sequences
from ttcore.distributions import CP, TensorTrain, tt_gap_products, tt_prefix_products


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


def test_neighbour_pairs_is_rank_two_tt_and_beats_rank_two_cp():
    n_pairs = 3
    tt = TensorTrain(_neighbour_pair_cores(n_pairs))
    seqs = all_sequences(2 * n_pairs, 2)
    support = (seqs[:, 0::2] == seqs[:, 1::2]).all(1)
    p = tt.cores.new_zeros(len(seqs))
    p[support] = 2.0 ** -n_pairs
    lp = TensorTrain(tt.cores.expand(len(seqs), -1, -1, -1, -1)).log_prob(seqs)
    torch.testing.assert_close(lp.exp(), p)
    entropy = n_pairs * math.log(2)
    # A rank-2 CP fitted by gradient on the exact cross-entropy stays strictly above the entropy:
    # the odd/even flattening of P is 2^N x 2^N identity, so exact CP rank is 2^N = 8.
    xs = seqs[support]
    best = math.inf
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(1, 2, generator=g, dtype=torch.float64).requires_grad_()
        f = torch.randn(1, 2 * n_pairs, 2, 2, generator=g, dtype=torch.float64).requires_grad_()
        opt = torch.optim.Adam([w, f], lr=0.1)
        for _ in range(400):
            cp = CP.from_logits(w.expand(len(xs), -1), f.expand(len(xs), -1, -1, -1))
            ce = -(cp.log_prob(xs) * 2.0 ** -n_pairs).sum()
            opt.zero_grad()
            ce.backward()
            opt.step()
        best = min(best, ce.item())
    tt_ce = -(lp[support] * 2.0 ** -n_pairs).sum().item()
    assert abs(tt_ce - entropy) < 1e-12
    assert best > entropy + 0.5, (best, entropy)


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
