"""Adaptive orderings and EB-Sampler inside a block (``sampler: blocks``, ``ttcore.sampling.steps.block``): the
law of a step that chooses by the block joint's exact marginals against the same law built by enumeration from
the model's exact scores, the chain rule and an unbounded EB budget against the exact likelihood (one joint draw
a block, whatever the order), EB's deadline, and runs at different blocks stepped together."""

import itertools

import pytest
import torch
from scipy.stats import chisquare
from tiny import tiny_block_model

from ttcore.sampling import GenerationRun, SamplerConfig, batch_step, generate
from ttcore.sampling.blocks import block_log_prob, block_score

N_DRAWS = 20_000
EVERY = torch.tensor(list(itertools.product(range(3), repeat=4)))  # every sequence of the tiny model
INDEX = torch.tensor([27, 9, 3, 1])


def _law_test(drawn: torch.Tensor, law: torch.Tensor) -> float:
    """The chi-square p-value of sequences ``drawn`` [n, 4] against ``law`` [81] (cells expected < 5 pooled)."""
    counts = torch.bincount((drawn * INDEX).sum(1), minlength=81).double()
    expected = law / law.sum() * drawn.shape[0]
    big = expected >= 5
    assert big.sum() >= 20, big.sum()  # a spread law: the test has power
    pooled = int((~big).any())
    obs = torch.cat([counts[big], counts[~big].sum()[None][:pooled]])
    exp = torch.cat([expected[big], expected[~big].sum()[None][:pooled]])
    return chisquare(obs.numpy(), exp.numpy()).pvalue


def _given(model, mask: list[bool]) -> torch.Tensor:
    """p(x_M | the rest) [81] of every sequence (``block_score``: exact), for a mask that it scores."""
    return block_score(model, EVERY, torch.tensor(mask).expand(81, -1))[0].exp().detach().double()


def _one_token_a_step_by_confidence(model) -> torch.Tensor:
    """The law [81] of two blocks of two, each in two steps: the first draws the block position whose exact
    marginal (the block joint's, given the blocks before) has the highest top probability, the second the other
    given it (the model run again with it known: its own conditional), built by enumeration from exact scores."""
    p = block_log_prob(model, EVERY).exp().detach().double().view(3, 3, 3, 3)
    law = torch.zeros(3, 3, 3, 3, dtype=torch.float64)
    joint0 = p.sum((2, 3))  # p(x0, x1)
    first0 = max((0, 1), key=lambda i: float(joint0.sum(1 - i).max()))
    marg0 = joint0.sum(1 - first0)
    # the second position of block 0 given the first: its score with block 1 (scored whole), block 1 summed out
    second0 = _given(model, [first0 == 1, first0 == 0, True, True]).view(3, 3, 3, 3).sum((2, 3))
    for x0, x1 in itertools.product(range(3), repeat=2):
        b1 = p[x0, x1] / p[x0, x1].sum()  # p(x2, x3 | block 0)
        first1 = max((0, 1), key=lambda i: float(b1.sum(1 - i).max()))
        second1 = _given(model, [False, False, first1 == 1, first1 == 0]).view(3, 3, 3, 3)[x0, x1]
        head = marg0[(x0, x1)[first0]] * second0[x0, x1]
        law[x0, x1] = head * b1.sum(1 - first1)[:, None] * second1 if first1 == 0 else \
            head * b1.sum(1 - first1)[None, :] * second1
    return law.flatten()


@pytest.mark.parametrize("decomposition,rank,contraction", [("cp", 3, "head"), ("tt", 2, "exact")])
def test_an_adaptive_ordering_inside_a_block_draws_by_its_exact_marginals(decomposition, rank, contraction):
    """``ordering: top_prob`` at two steps a block of two (``adaptive_path: fast``): chi-square of 20,000 draws
    against the law enumerated from the model's exact scores (``_one_token_a_step_by_confidence``); 4,000 draws of
    the random order at the same steps fail it (the test has power); EB at gamma 0 ranked by entropy takes one token
    a step and draws what ``ordering: entropy`` draws, token for token."""
    model = tiny_block_model(decomposition, rank, head_scale=3)  # sharper joints: the orders' laws far apart
    law = _one_token_a_step_by_confidence(model)
    settings = dict(sampler="blocks", contraction=contraction)
    drawn = list(generate(model, N_DRAWS, 4, seed=2, ordering="top_prob", **settings))[-1].tokens
    assert _law_test(drawn, law) > 1e-3
    randomly = list(generate(model, 4000, 4, seed=2, **settings))[-1].tokens
    assert _law_test(randomly, law) < 1e-6
    for path in ("fast", "exact"):
        by_entropy = list(generate(model, 64, 4, seed=3, ordering="entropy", adaptive_path=path, **settings))
        eb = list(generate(model, 64, 4, seed=3, block_eb_gamma=0.0, adaptive_path=path, **settings))
        assert [int(s.committed.sum()) for s in eb] == [64] * 4
        assert torch.equal(eb[-1].tokens, by_entropy[-1].tokens), path


@pytest.mark.parametrize("settings", [dict(ordering="margin", adaptive_path="exact", steps=2),
                                      dict(block_eb_gamma=1e6, steps=4),
                                      dict(block_eb_gamma=1e6, adaptive_path="exact", steps=4)])
def test_a_whole_block_a_step_by_any_order_draws_the_exact_likelihoods_law(settings):
    """One step a block by the exact chain rule (any order: the chain rule of the block's joint is that joint), and
    EB with an unbounded budget (which takes each block whole, so 2 model calls where 4 steps were allowed):
    chi-square of 20,000 TT draws against exp(block_log_prob)."""
    model = tiny_block_model("tt", 2)
    settings = dict(settings)
    steps = settings.pop("steps")
    run = GenerationRun(model, N_DRAWS, steps, SamplerConfig(sampler="blocks", **settings), seed=6)
    while not run.done:
        run.step()
    assert run.model_calls == 2
    law = block_log_prob(model, EVERY).exp().detach().double()
    assert _law_test(run.tokens, law) > 1e-3


def test_eb_inside_a_block_keeps_each_blocks_deadline_and_rows_at_different_blocks_step_together():
    """EB at gamma 0 with 3 steps for 2 blocks of 2: one token, then block 0's last (its deadline: as many steps
    left as blocks to draw), then block 1 whole; at a middle budget the rows of one run are at different blocks in
    one step, and runs stepped together (with a fixed one) get the tokens each gets alone."""
    model = tiny_block_model("tt", 2, length=8, head_scale=3)  # a sharper head: entropies that differ
    model4 = tiny_block_model("tt", 2)
    deadline = list(generate(model4, 16, 3, seed=0, sampler="blocks", block_eb_gamma=0.0))
    assert [int(s.committed.sum()) for s in deadline] == [16, 16, 32]
    assert bool(deadline[2].committed[:, 2:].all())
    run = GenerationRun(model, 32, 8, SamplerConfig(sampler="blocks", block_eb_gamma=0.7), seed=1)
    spread = set()
    while not run.done:
        masked = (run.tokens == 3).view(32, 4, 2).any(2)
        spread.add(len(set(masked.long().argmax(1)[masked.any(1)].tolist())))
        run.step()
    assert max(spread) > 1 and (run.tokens != 3).all()  # rows of one run at different blocks in one step
    specs = [(8, dict(block_eb_gamma=0.4), 1), (4, {}, 2), (16, dict(block_eb_gamma=0.1, ordering="top_prob"), 3)]
    runs = [GenerationRun(model, 5, steps, SamplerConfig(sampler="blocks", **s), seed=seed) for steps, s, seed in specs]
    alone = [list(generate(model, 5, steps, seed=seed, sampler="blocks", **s))[-1].tokens for steps, s, seed in specs]
    while not all(r.done for r in runs):
        batch_step(model, [r for r in runs if not r.done])
    assert all(torch.equal(r.tokens, a) for r, a in zip(runs, alone))
