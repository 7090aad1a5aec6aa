"""Schedules, orderings and the EB bound on crafted inputs (the sampler itself: test_eb.py)."""

import torch

from ttcore.sampling import PREDETERMINED, eb_accepts, top_k_mask, unmask_counts
from ttcore.sampling.orderings import entropy_score, margin_score, top_prob_score
from ttcore.sampling.schedules import SCHEDULES


def _accepted(h: torch.Tensor, gamma: float) -> torch.Tensor:
    """Length of the accepted prefix under ``eb_accepts``, at least one (the sampler's rule). -> [b]."""
    return torch.clamp_min(eb_accepts(h, gamma).long().cumprod(-1).sum(-1), 1)


def test_eb_bound_on_crafted_entropies():
    h = torch.tensor([[0.0, 0.1, 0.2, 0.5, 1.0]], dtype=torch.float64)  # in pick order
    # prefix k accepted iff the sum of its entries minus their max <= gamma
    expected = {0.0: 2, 0.05: 2, 0.15: 3, 0.29: 3, 0.35: 4, 0.79: 4, 0.81: 5, 10.0: 5}
    for gamma, count in expected.items():
        assert int(_accepted(h, gamma)) == count, gamma
    flat = torch.full((1, 5), 0.4, dtype=torch.float64)
    assert int(_accepted(flat, 0.0)) == 1  # gamma = 0: one token per step


def test_eb_prefix_never_shrinks_with_gamma():
    g = torch.Generator().manual_seed(0)
    h = torch.rand(50, 12, generator=g, dtype=torch.float64)
    prev = torch.zeros(50, dtype=torch.long)
    for gamma in torch.linspace(0, 6, 40):
        c = _accepted(h, float(gamma))
        assert (c >= prev).all() and (c >= 1).all()
        prev = c


def test_adaptive_orderings_pick_what_they_claim():
    probs = torch.tensor([[[0.5, 0.5, 0.0], [0.6, 0.2, 0.2], [0.45, 0.45, 0.1], [0.55, 0.44, 0.01]]])
    assert int(top_prob_score(probs).argmax()) == 1  # highest max-probability
    assert int(margin_score(probs).argmax()) == 1  # largest top-1 minus top-2: 0.4
    assert int(entropy_score(probs).argmax()) == 0  # lowest entropy: ln 2 beats 0.95 and 0.74
    probs2 = torch.tensor([[[0.7, 0.3, 0.0], [0.6, 0.1, 0.3], [0.1, 0.1, 0.8]]])
    assert int(margin_score(probs2).argmax()) == 2 and int(top_prob_score(probs2).argmax()) == 2
    assert int(entropy_score(probs2).argmax()) == 0


def test_predetermined_orderings():
    masked = torch.tensor([[True, False, True, True, True, True]])
    ltr = PREDETERMINED["left_to_right"](1, 6, "cpu")
    assert top_k_mask(ltr, masked, torch.tensor([2])).nonzero()[:, 1].tolist() == [0, 2]
    hal = PREDETERMINED["halton"](1, 16, "cpu", torch.Generator().manual_seed(0))
    first = top_k_mask(hal, torch.ones(1, 16, dtype=torch.bool), torch.tensor([4])).nonzero()[:, 1]
    gaps = sorted(((first.roll(-1) - first) % 16).tolist())
    assert gaps == [4, 4, 4, 4]  # the first four Halton picks are evenly spread
    counts = torch.zeros(8)
    g = torch.Generator().manual_seed(0)
    for _ in range(4000):
        pr = PREDETERMINED["random"](1, 8, "cpu", g)
        counts += top_k_mask(pr, torch.ones(1, 8, dtype=torch.bool), torch.tensor([2]))[0].double()
    assert (counts / 4000 - 0.25).abs().max() < 0.03


def test_schedules_sum_to_n_and_give_one_token_per_step_when_k_ge_n():
    n = torch.tensor([22, 7, 0])
    for name, f in SCHEDULES.items():
        for steps in (1, 2, 5, 22, 40):
            left, total = n.clone(), torch.zeros_like(n)
            for k in range(steps):
                c = unmask_counts(n, left, steps, k, f)
                assert (c >= 0).all() and (c <= left).all()
                left, total = left - c, total + c
                if name == "loglinear" and steps >= 22:
                    assert (c <= 1).all()
            assert torch.equal(total, n), (name, steps)
    n = torch.tensor([20])
    early = [int(unmask_counts(n, n, 10, k, SCHEDULES["cosine"])) for k in range(3)]
    late = [int(unmask_counts(n, n, 10, k, SCHEDULES["cosine"])) for k in range(6, 9)]
    assert sum(early) < sum(late)


def test_step_kind_says_what_each_sampler_setting_holds():
    """Admission, evaluation and the memory benchmark size passes by one rule: which settings hold full cores
    (adaptive) and which TT steps sum the cores themselves (exact)."""
    from types import SimpleNamespace

    from ttcore.decompositions import get_decomposition
    from ttcore.sampling import cost

    tt, cp = SimpleNamespace(format=get_decomposition("tt")), SimpleNamespace(format=get_decomposition("cp"))
    assert cost.step_kind(tt) == (False, False)  # random order, the head's contraction
    assert cost.step_kind(tt, ordering="top_prob") == (False, False)  # the fast path (the default): c outputs
    assert cost.step_kind(tt, ordering="top_prob", adaptive_path="exact") == (True, False)
    assert cost.step_kind(tt, eb_gamma=0.5, adaptive_path="exact") == (True, False)
    assert cost.step_kind(tt, joint=False) == (False, True)  # the rank-1 view: exact marginals at T only
    assert cost.step_kind(tt, joint=False, ordering="margin") == (True, False)  # ranks every marginal
    assert cost.step_kind(cp, joint=False) == (False, False)  # r factors of the chosen positions
    assert cost.step_kind(tt, contraction="exact") == (False, True)
    assert cost.step_kind(tt, temperature=0.7) == (False, True)  # the head predicts the untempered sum
    assert cost.step_kind(cp, contraction="exact", temperature=0.7, seed=3) == (False, False)  # only TT sums
