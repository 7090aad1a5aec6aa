"""Distillation's objectives (``ttcore.distill``) against brute force on tiny models: the student's step
log-likelihood is the law the served step draws from, and the joint objective's optimum is the teacher's joint."""

import itertools

import numpy as np
import pytest
import torch
from brute import chi_square_pvalue
from tiny import tiny_model

from ttcore.distributions import Streams

V, L = 3, 5


def _state(model):
    """One partially known sequence repeated: positions 0 and 3 known, 1, 2, 4 masked; T = {1, 4} (2 between)."""
    mask_id = model.cfg.dit.vocab_size - 1
    x_t = torch.tensor([[1, mask_id, mask_id, 0, mask_id]])
    masked = x_t == mask_id
    chosen = torch.tensor([[False, True, False, False, True]])
    return x_t, masked, chosen


@pytest.mark.parametrize("decomposition,rank", [("none", 1), ("cp", 3), ("tt", 2)])
def test_a_students_step_log_likelihood_is_the_law_the_served_step_draws(decomposition, rank):
    """exp(chosen_log_prob) over every assignment of T sums to 1, and 20,000 draws of the served step
    (``Decomposition.draw``, the head contraction) follow it (chi-square): the objective fits what is served."""
    model = tiny_model(decomposition, V, L, rank, perturb=0.5, noise=0.5)
    fmt, head = model.format, model.head
    x_t, masked, chosen = _state(model)
    with torch.no_grad():
        h = model.features(x_t).float()
        outcomes = np.array(list(itertools.product(range(V), repeat=2)))
        x = x_t.repeat(len(outcomes), 1)
        x[:, 1], x[:, 4] = torch.from_numpy(outcomes[:, 0]), torch.from_numpy(outcomes[:, 1])
        n = len(outcomes)
        logp = fmt.chosen_log_prob(head, h.expand(n, -1, -1), masked.expand(n, -1), chosen.expand(n, -1), x)
        p = logp.double().exp().numpy()
        assert p.sum() == pytest.approx(1.0, abs=1e-5)
        draws = 20_000
        streams = Streams.of_request(7, draws)
        drawn = fmt.draw(head, h.expand(draws, -1, -1), x_t.expand(draws, -1), masked.expand(draws, -1),
                         chosen.expand(draws, -1), 1.0, streams, "head")
    samples = drawn[:, [1, 4]].numpy()
    assert chi_square_pvalue(samples, p, outcomes) > 1e-3


def test_the_joint_objective_fits_a_teachers_joint_that_no_factorized_student_can():
    """A teacher joint over two positions with perfect correlation (x1 = x2, uniform): minimizing the joint
    objective's expected loss (exact over the teacher's outcomes) drives a TT r = 3 student to it (total
    variation < 0.05), while a rank-1 student cannot go below TV 1 - 1/V = 2/3 (its optimum is the product of
    the marginals)."""
    from ttcore.distill import step_log_prob

    target = torch.zeros(V, V)
    target[range(V), range(V)] = 1 / V
    every = torch.tensor(list(itertools.product(range(V), repeat=2)))
    outcomes = every[target[every[:, 0], every[:, 1]] > 0]  # the teacher's support (0 log 0 = 0)
    weights = target[outcomes[:, 0], outcomes[:, 1]]
    results = {}
    for decomposition, rank in (("tt", 3), ("none", 1)):
        model = tiny_model(decomposition, V, 2, rank, perturb=0.1, noise=0.5).train()
        mask_id = model.cfg.dit.vocab_size - 1
        x_t = torch.full((len(outcomes), 2), mask_id)
        chosen = torch.ones_like(x_t, dtype=torch.bool)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        for _ in range(300):
            opt.zero_grad()
            loss = -(weights * step_log_prob(model, x_t, chosen, outcomes)).sum()
            loss.backward()
            opt.step()
        with torch.no_grad():
            q = step_log_prob(model, x_t, chosen, outcomes).exp()  # on the support; the rest is 1 - q.sum()
        results[decomposition] = 0.5 * ((q - weights).abs().sum() + (1 - q.sum())).item()
    assert results["tt"] < 0.05 and results["none"] > 0.6, results
