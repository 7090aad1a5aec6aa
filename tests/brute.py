"""Brute-force references: dense joint tensors by enumeration, written independently of ttcore."""

import itertools

import numpy as np
import torch
from scipy import stats


def all_sequences(l: int, v: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(v), repeat=l)), dtype=torch.long)  # [v^l, l]


def dense_factorized(probs: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """probs [l, v] -> p(seq) for each row of seqs."""
    return np.array([np.prod([probs[i, s[i]] for i in range(len(s))]) for s in seqs])


def dense_cp(weights: np.ndarray, factors: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """weights [r], factors [l, r, v]."""
    out = []
    for s in seqs:
        out.append(sum(weights[a] * np.prod([factors[i, a, s[i]] for i in range(len(s))])
                       for a in range(len(weights))))
    return np.array(out)


def dense_tt(cores: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """cores [l, v, r, r]: (1/r) 1^T G_1(x_1) ... G_l(x_l) 1 by left-to-right products."""
    r = cores.shape[-1]
    out = []
    for s in seqs:
        vec = np.ones(r) / r
        for i, x in enumerate(s):
            vec = vec @ cores[i, x]
        out.append(vec.sum())
    return np.array(out)


def conditional(p: np.ndarray, seqs: np.ndarray, x_cond: np.ndarray, v: int) -> np.ndarray:
    """p(x^i | x_S) for every free i by summing the dense joint: -> [l, v] (rows of known i are one-hot)."""
    keep = np.all((x_cond < 0) | (seqs == x_cond), axis=1)
    l = seqs.shape[1]
    out = np.zeros((l, v))
    for i in range(l):
        for x in range(v):
            out[i, x] = p[keep & (seqs[:, i] == x)].sum()
        out[i] /= out[i].sum()
    return out


def chi_square_pvalue(draws: np.ndarray, p: np.ndarray, outcomes: np.ndarray) -> float:
    """Pearson chi-square of draws [n, k] against probabilities p of the rows of outcomes [m, k];
    bins with expected count < 5 are pooled into one."""
    n = len(draws)
    index = {tuple(o): j for j, o in enumerate(outcomes)}
    counts = np.zeros(len(outcomes))
    for d in draws:
        counts[index[tuple(d)]] += 1
    expected = p * n
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        assert obs[-1] == 0, "drew an outcome of probability zero"
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
