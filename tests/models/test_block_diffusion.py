"""Block diffusion (``ttcore.kinds.block_diffusion``): the block-causal attention and BD3-LM's vectorized
training pass checked against their definitions, the per-block joint's exact likelihood against enumeration,
and the sampler's law at one step per block against that likelihood by a chi-square test."""

import itertools

import pytest
import torch
from scipy.stats import chisquare
from tiny import tiny_block_model as _model

from ttcore.errors import InvalidSampler
from ttcore.kinds import BLOCK_DIFFUSION
from ttcore.losses import block_diffusion_loss, mdlm_loss
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.models.block_attention import block_causal_mask, training_features, training_mask
from ttcore.sampling import SamplerConfig, generate
from ttcore.sampling.blocks import block_chain_log_prob, block_counts, block_log_prob, block_score, scorable

N_DRAWS = 20_000  # a block step's law against enumeration: chi-square on this many draws


def _draw(model, n: int, k: int, seed: int, prompt=None, kv_cache: bool = True) -> torch.Tensor:
    """n sequences of ``sampler: blocks`` at k steps a block."""
    blocks = model.cfg.dit.length // model.cfg.dit.block_size
    run = generate(model, n, k * blocks, seed=seed, sampler="blocks", prompt=prompt, kv_cache=kv_cache)
    return list(run)[-1].tokens


def test_the_masks_are_their_definitions():
    l, b = 6, 2
    blk = [i // b for i in range(l)]
    causal = block_causal_mask(l, b)
    assert all(bool(causal[i, j]) == (blk[j] <= blk[i]) for i in range(l) for j in range(l))
    m = training_mask(l, b)
    for i, j in itertools.product(range(2 * l), repeat=2):
        qi, kj = blk[i % l], blk[j % l]
        want = (qi == kj if j < l else kj < qi) if i < l else (j >= l and kj <= qi)
        assert bool(m[i, j]) == want, (i, j)


@pytest.mark.parametrize("shifted", [False, True])
def test_a_block_reads_only_the_blocks_up_to_it(shifted):
    model = _model(length=6, shifted=shifted)
    x = torch.randint(0, 3, (4, 6))
    h = model.features(x)
    y = x.clone()
    y[:, 4:] = torch.randint(0, 4, (4, 2))  # the last block changed, [MASK] included
    assert torch.allclose(model.features(y)[:, :4], h[:, :4], atol=1e-5)
    y[:, 1] = (x[:, 1] + 1) % 3  # the first block changed: every block after it reads it
    assert not torch.allclose(model.features(y)[:, 2:4], h[:, 2:4], atol=1e-5)


@pytest.mark.parametrize("shifted", [False, True])
def test_the_training_pass_gives_each_block_what_generation_computes_for_it(shifted):
    """BD3-LM's one pass over [x_t, x_0] against generation's view, block by block: the committed clean blocks
    before B, then B noised as x_t (what comes after is irrelevant to B). Shifted inputs: B's first position reads
    the clean token before B (``training_inputs``), as generation's forward of the view reads it."""
    model = _model(length=6, shifted=shifted)
    x0 = torch.randint(0, 3, (3, 6))
    x_t = torch.where(torch.rand(3, 6) < 0.5, torch.full_like(x0, 3), x0)
    h = training_features(model, x_t, x0)
    for block in range(3):
        at = slice(2 * block, 2 * block + 2)
        view = torch.cat([x0[:, :2 * block], x_t[:, at], torch.full_like(x0[:, 2 * block + 2:], 3)], 1)
        assert torch.allclose(h[:, at], model.features(view)[:, at], atol=1e-5), block


def test_a_full_sequence_model_becomes_a_block_model_of_its_weights():
    """JointModel.as_blocks (BD3-LM's start from an MDLM): one block of the whole length is the full-sequence model
    itself; smaller blocks make it block-causal; a padded length reads the same weights."""
    full = _model(length=4, block=0)
    x = torch.randint(0, 3, (5, 4))
    one = full.as_blocks(4).eval()
    assert one.cfg.kind.name == "block_diffusion" and torch.allclose(one.features(x), full.features(x), atol=1e-6)
    two = full.as_blocks(2, length=6).eval()
    assert (two.cfg.dit.block_size, two.cfg.dit.length) == (2, 6)
    assert all(torch.equal(a, b) for a, b in zip(two.state_dict().values(), full.state_dict().values()))
    y = torch.cat([x, torch.full((5, 2), 3)], 1)  # block 0 reads itself alone: the base on those two tokens
    assert torch.allclose(two.features(y)[:, :2], full.features(x[:, :2]), atol=1e-5)


def test_an_autoregressive_model_becomes_a_block_model_of_its_weights_and_at_one_token_a_block_is_itself():
    """SDAR's start: ``as_blocks`` of an autoregressive model keeps its shifted inputs; at b = 1 its exact
    likelihood is the autoregressive model's on every sequence (position i reads x^{i-1} and attends to positions
    up to i in both); at b = 2 the rank-1 block joint's likelihood sums to 1 and differs from it (a block's first
    position now reads its block's other position, a [MASK] the autoregressive model never saw)."""
    from ttcore.kinds.autoregressive import ar_log_prob

    torch.manual_seed(0)
    dit = DiTConfig(vocab_size=4, out_vocab=3, length=4, hidden_dim=32, cond_dim=16, n_blocks=2, n_heads=2,
                    causal=True)
    ar = JointModel(ModelConfig(dit, "none", 1, "1layer"))
    with torch.no_grad():
        for p in ar.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ar.eval()
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    one, two = ar.as_blocks(1).eval(), ar.as_blocks(2).eval()
    assert one.cfg.kind.name == "block_diffusion" and one.cfg.dit.causal and two.cfg.dit.causal
    with torch.no_grad():
        want = ar_log_prob(ar, every).double()
        assert torch.allclose(block_log_prob(one, every), want, atol=1e-5)
        got = block_log_prob(two, every)
        assert torch.allclose(got.exp().sum(), torch.tensor(1.0, dtype=torch.float64))
        assert not torch.allclose(got, want, atol=1e-3)


def test_with_one_block_the_loss_is_mdlms_joint_nll():
    """block_size = l: one block, no clean context, so the objective is MDLM's on the same masks."""
    model = _model(length=4, block=4)
    x0 = torch.randint(0, 3, (5, 4))
    t = torch.rand(5, 1) * 0.9 + 0.1
    mask = torch.rand(5, 4) < t
    ours = block_diffusion_loss(model, x0, 3, t=t, mask=mask)
    full = JointModel(ModelConfig(DiTConfig(**{**model.cfg.dit.__dict__, "block_size": 0}), "tt", 2, "1layer"))
    full.load_state_dict(model.state_dict())
    theirs = mdlm_loss(full.eval(), x0, 3, t=t[:, 0], mask=mask)
    assert torch.allclose(ours["nll"], theirs["nll"], atol=1e-5)
    assert torch.allclose(ours["nelbo"], theirs["nelbo"], atol=1e-5)


@pytest.mark.parametrize("decomposition,rank,shifted", [("none", 1, False), ("cp", 3, False), ("tt", 2, False),
                                                        ("tt", 2, True)])
def test_the_exact_likelihood_sums_to_one_over_every_sequence(decomposition, rank, shifted):
    model = _model(decomposition, rank, shifted=shifted)
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))  # 81 sequences
    assert abs(block_log_prob(model, every).exp().sum().item() - 1) < 1e-5
    assert BLOCK_DIFFUSION.exact_nll(model, every[:7]).item() == pytest.approx(
        -block_log_prob(model, every[:7]).mean().item() / 4)


@pytest.mark.parametrize("decomposition,rank", [("none", 1), ("cp", 3), ("tt", 2)])
def test_a_scored_suffix_of_blocks_given_known_positions_sums_to_one(decomposition, rank):
    """``block_score`` of the positions after a known one (blocks of 2: position 0 known, 1-3 scored) over every
    completion sums to 1; scoring everything is ``block_log_prob``; the per-position terms are each block's exact
    marginals (a fully scored block's first position: summed over the rest of the block by enumeration)."""
    model = _model(decomposition, rank)
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    for known in range(3):
        rows = every[every[:, 0] == known]  # the 27 completions of x0 = known
        mask = torch.tensor([[False, True, True, True]]).expand(len(rows), -1)
        log_p, token = block_score(model, rows, mask)
        assert abs(log_p.exp().sum().item() - 1) < 1e-5 and token[:, 0].isnan().all()
    full = torch.ones_like(every, dtype=torch.bool)
    log_p, token = block_score(model, every, full)
    assert torch.allclose(log_p, block_log_prob(model, every))
    joint = log_p.exp().view(3, 3, 3, 3)  # p(x0, x1, x2, x3) = p(x0, x1) p(x2, x3 | x0, x1)
    first = joint.sum((1, 2, 3))  # p(x0): block 0's marginal
    assert torch.allclose(token[:, 0].exp(), first[every[:, 0]], atol=1e-6)


def test_what_a_block_model_scores_exactly_is_a_suffix_of_whole_blocks():
    mask = torch.tensor([[False, True, True, True],    # known inside the first scored block: fine
                         [True, False, True, True],    # the same
                         [False, False, True, False],  # inside the first scored block (block 1): fine
                         [False, True, False, False],  # a known token after the first scored block: refused
                         [True, True, False, True],    # the same
                         [False, False, False, False]])  # nothing scored: nothing to refuse
    assert scorable(mask, 2).tolist() == [True, True, True, False, False, True]
    model = _model()
    assert BLOCK_DIFFUSION.score_refusal(model.cfg, mask[:3]) is None
    assert "no known token may follow the block" in BLOCK_DIFFUSION.score_refusal(model.cfg, mask)
    with pytest.raises(ValueError):
        block_score(model, torch.zeros(6, 4, dtype=torch.long), mask)


@pytest.mark.parametrize("decomposition,rank,shifted", [("none", 1, False), ("cp", 3, False), ("tt", 2, False),
                                                        ("tt", 2, True)])
def test_one_step_per_block_draws_the_exact_likelihoods_law(decomposition, rank, shifted):
    """Chi-square of 20,000 sequences drawn at k = 1 against exp(block_log_prob) over all 81, for each head, and
    for a TT over shifted inputs (``DiTConfig.causal``)."""
    model = _model(decomposition, rank, shifted=shifted)
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    p = block_log_prob(model, every).exp().detach()
    drawn = _draw(model, N_DRAWS, 1, seed=1)
    index = (drawn * torch.tensor([27, 9, 3, 1])).sum(1)
    counts = torch.bincount(index, minlength=81).double()
    expected = p / p.sum() * N_DRAWS
    big = expected >= 5  # cells expected fewer than 5 times are pooled into one
    assert big.sum() >= 20, big.sum()  # a spread law: the test has power
    pooled = [counts[~big].sum()[None], expected[~big].sum()[None]] if (~big).any() else [counts[:0], counts[:0]]
    obs, exp = torch.cat([counts[big], pooled[0]]), torch.cat([expected[big], pooled[1]])
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3
    # the test's power: two steps a block (one token each, the second given the first through the network, not
    # the joint's own conditional) draw another law, and the same test rejects it
    two = _draw(model, N_DRAWS, 2, seed=1)
    counts2 = torch.bincount((two * torch.tensor([27, 9, 3, 1])).sum(1), minlength=81).double()
    obs2 = torch.cat([counts2[big], counts2[~big].sum()[None]]) if (~big).any() else counts2[big]
    assert chisquare(obs2.numpy(), exp.numpy()).pvalue < 1e-6
    again = _draw(model, N_DRAWS, 1, seed=1)
    assert torch.equal(again, drawn)  # counter-based: the same seed, the same sequences
    assert torch.equal(_draw(model, 10, 1, seed=1), drawn[:10])  # whatever the batch


@pytest.mark.parametrize("decomposition,rank", [("none", 1), ("cp", 3), ("tt", 2)])
def test_one_token_a_step_left_to_right_draws_the_chain_likelihoods_law(decomposition, rank):
    """``block_chain_log_prob`` sums to 1 over all 81 sequences, and 20,000 sequences drawn at b steps a block left
    to right follow exp of it (chi-square); the k = 1 draws, another law, are rejected by the same test."""
    model = _model(decomposition, rank)
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    p = block_chain_log_prob(model, every).exp().detach()
    assert abs(p.sum().item() - 1) < 1e-5
    blocks = model.cfg.dit.length // model.cfg.dit.block_size
    run = generate(model, N_DRAWS, 2 * blocks, seed=3, sampler="blocks", ordering="left_to_right")
    counts = torch.bincount((list(run)[-1].tokens * torch.tensor([27, 9, 3, 1])).sum(1), minlength=81).double()
    expected = p / p.sum() * N_DRAWS
    big = expected >= 5
    assert big.sum() >= 20, big.sum()
    pool = lambda c: torch.cat([c[big], c[~big].sum()[None]]) if (~big).any() else c[big]  # noqa: E731
    assert chisquare(pool(counts).numpy(), pool(expected).numpy()).pvalue > 1e-3
    one = torch.bincount((_draw(model, N_DRAWS, 1, seed=3) * torch.tensor([27, 9, 3, 1])).sum(1), minlength=81)
    assert chisquare(pool(one.double()).numpy(), pool(expected).numpy()).pvalue < 1e-6


@pytest.mark.parametrize("kv_cache", [True, False])
def test_a_prompt_conditions_the_draw_as_the_exact_score_says(kv_cache):
    """A prompt giving position 0 (blocks of 2): the k = 1 draws of positions 1-3 of ``sampler: blocks``, over
    the block cache and without it (the prefix's forward each step), follow exp(block_score) of the scored
    positions given position 0 (chi-square on 6,000 draws over the 27 completions); a prompt giving a whole
    block prefills it (the first block's steps run nothing); a known token after the first masked block is
    refused."""
    from ttcore.sampling import GenerationRun, SamplerConfig

    model = _model("tt", 2)
    every = torch.tensor(list(itertools.product(range(3), repeat=3)))  # positions 1-3
    rows = torch.cat([torch.full((27, 1), 2), every], 1)
    mask = torch.tensor([[False, True, True, True]]).expand(27, -1)
    p = block_score(model, rows, mask)[0].exp().detach()
    prompt = torch.tensor([2, 3, 3, 3])  # 3: the mask id
    drawn = _draw(model, 6000, 1, seed=5, prompt=prompt, kv_cache=kv_cache)
    assert (drawn[:, 0] == 2).all()
    counts = torch.bincount((drawn[:, 1:] * torch.tensor([9, 3, 1])).sum(1), minlength=27).double()
    assert chisquare(counts.numpy(), (p / p.sum() * 6000).numpy()).pvalue > 1e-3
    whole = torch.tensor([1, 0, 3, 3])
    run = GenerationRun(model, 4, 2, SamplerConfig(sampler="blocks"), seed=0, prompt=whole)
    assert run.sampler.active_steps(run) == [1]  # block 0 is given: only block 1's step runs
    assert run.skip_idle_steps() == 1
    given = _draw(model, 4, 1, seed=0, prompt=whole, kv_cache=kv_cache)
    assert (given[:, :2] == whole[:2]).all() and (given != 3).all()
    with pytest.raises(InvalidSampler) as refused:
        GenerationRun(model, 1, 2, SamplerConfig(sampler="blocks"), seed=0, prompt=torch.tensor([3, 3, 1, 3]))
    assert refused.value.field == "prompt"


@pytest.mark.parametrize("decomposition,rank,settings", [("none", 1, {}), ("cp", 3, {}), ("tt", 2, {}),
                                                         ("tt", 2, {"block_eb_gamma": 1e6, "steps": 4})])
def test_a_constrained_block_step_draws_each_block_from_its_joint_restricted_to_what_can_still_be_accepted(
        decomposition, rank, settings):
    """A language over 3 tokens (the first is not 0, the number of 2s is even): at k = 1 each block is drawn from
    its joint restricted to the block completions some accepted sequence continues (block 0: x0 != 0; block 1:
    the parity fixed), so the law is p(b0) f(b0) / sum f p  x  p(b1 | b0) 1_L / sum_L p(b1 | b0); chi-square of
    20,000 draws of the batched loop against it, every draw accepted. EB inside the block with an unbounded budget
    (up to 4 steps) takes each block whole: the same law."""
    from ttcore.constraints import TokenDFA

    model = _model(decomposition, rank)
    delta = torch.tensor([[-1, 1, 2], [1, 1, 2], [2, 2, 1]])
    dfa = TokenDFA.of_tokens(delta, torch.tensor([False, True, False]))
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    accepted = (every[:, 0] != 0) & ((every == 2).sum(1) % 2 == 0)
    joint = block_log_prob(model, every).exp().detach().double().view(9, 9)  # [b0, b1]
    ok = accepted.view(9, 9).double()
    p_b0 = joint.sum(1) * (ok.sum(1) > 0)
    law = (p_b0 / p_b0.sum())[:, None] * (joint * ok) / (joint * ok).sum(1, keepdim=True).clamp_min(1e-300)
    settings = dict(settings)
    drawn = list(generate(model, N_DRAWS, settings.pop("steps", 2), seed=4, sampler="blocks", constraint=dfa,
                          **settings))[-1].tokens
    index = (drawn * torch.tensor([27, 9, 3, 1])).sum(1)
    assert bool(accepted[index].all())
    counts = torch.bincount(index, minlength=81).double()
    expected = law.flatten() * N_DRAWS
    keep = expected > 0
    assert counts[~keep].sum() == 0 and keep.sum() >= 20
    assert chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue > 1e-3


def test_the_batched_loop_runs_only_the_blocks_up_to_the_current_one():
    """``BlockStep.prefix_needed``: the coming step reads positions up to its block's end, and those features of
    the prefix alone are the full forward's (block-causal: no block reads a later one)."""
    from ttcore.sampling import GenerationRun, SamplerConfig
    from ttcore.sampling.generate import _prefix_features

    model = _model(length=8, block=2).double()
    run = GenerationRun(model, 3, 8, SamplerConfig(sampler="blocks"), seed=0)  # k = 2
    assert [run.sampler.prefix_needed(run)] == [2]
    run.step(), run.step(), run.step()
    assert run.sampler.prefix_needed(run) == 4  # step 3: block 1's second step
    x = torch.randint(0, 3, (3, 8))
    with torch.no_grad():
        full, prefix = model.features(x), _prefix_features(model, x, None, 4)
    assert torch.allclose(prefix[:, :4], full[:, :4], atol=1e-10) and (prefix[:, 4:] == 0).all()


def test_several_steps_per_block_unmask_the_even_split_and_finish():
    assert block_counts(4, 3) == [2, 1, 1] and block_counts(2, 5) == [1, 1]
    model = _model(length=8, block=4)
    out = _draw(model, 16, 3, seed=0)
    assert out.shape == (16, 8) and (out < 3).all() and (out >= 0).all()


def test_the_batched_loops_block_step_draws_the_same_law_and_is_batch_invariant():
    """``sampler: blocks`` in GenerationRun / batch_step (what the service runs): at k = 1 the chi-square against
    the exact likelihood holds; several runs stepped together get their own tokens; k = 2 finishes."""
    from ttcore.sampling import GenerationRun, SamplerConfig, batch_step

    model = _model("tt", 2)
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    p = block_log_prob(model, every).exp().detach()
    drawn = list(generate(model, 6000, 2, seed=3, sampler="blocks"))[-1].tokens
    counts = torch.bincount((drawn * torch.tensor([27, 9, 3, 1])).sum(1), minlength=81).double()
    assert chisquare(counts.numpy(), (p / p.sum() * 6000).numpy()).pvalue > 1e-3
    runs = [GenerationRun(model, 3, steps, SamplerConfig(sampler="blocks", ordering=o), seed=s)
            for steps, o, s in ((2, "random", 0), (4, "left_to_right", 1), (4, "random", 2))]
    alone = [list(generate(model, 3, steps, seed=s, sampler="blocks", ordering=o))[-1].tokens
             for steps, o, s in ((2, "random", 0), (4, "left_to_right", 1), (4, "random", 2))]
    while not all(r.done for r in runs):
        batch_step(model, [r for r in runs if not r.done])
    assert all(torch.equal(r.tokens, a) for r, a in zip(runs, alone))
    two = list(generate(model, 4, 4, seed=0, sampler="blocks", ordering="left_to_right"))
    assert [int(s.committed.sum()) for s in two] == [4, 4, 4, 4]  # one token a row a step, block by block
    assert bool(two[0].committed[:, 0].all()) and bool(two[2].committed[:, 2].all())


def test_the_rank_one_view_draws_each_block_position_from_its_exact_marginal():
    """``joint: false`` on ``sampler: blocks`` at k = 1: block 0's two positions independent, each from its exact
    marginal, block 1's likewise given block 0 (the marginals summed from exp(block_score) over all 81 sequences);
    a chi-square against that law holds, and against the joint's law (the default) it fails."""
    model = _model("tt", 3, head_scale=3)  # a sharper head: a block's joint 0.13 in TV from its marginals' product
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    p = block_log_prob(model, every).exp().detach().double().reshape(3, 3, 3, 3)
    p = p / p.sum()
    first = p.sum((2, 3))  # [x0, x1]
    second = p / first[:, :, None, None]  # p(x2, x3 | x0, x1)
    view = (first.sum(1)[:, None] * first.sum(0)[None, :])[:, :, None, None] \
        * second.sum(3)[:, :, :, None] * second.sum(2)[:, :, None, :]
    drawn = list(generate(model, 6000, 2, seed=4, sampler="blocks", joint=False))[-1].tokens
    counts = torch.bincount((drawn * torch.tensor([27, 9, 3, 1])).sum(1), minlength=81).double()
    assert chisquare(counts.numpy(), (view.flatten() * 6000).numpy()).pvalue > 1e-3
    assert chisquare(counts.numpy(), (p.flatten() * 6000).numpy()).pvalue < 1e-6  # the joint's law differs


def test_what_sampler_blocks_does_not_take_is_refused_naming_the_field():
    model = _model()
    for settings, field in (({"schedule": "cosine"}, "schedule"), ({"bernoulli": True}, "bernoulli")):
        with pytest.raises(InvalidSampler, match="evenly") as e:
            list(generate(model, 2, 2, seed=0, sampler="blocks", **settings))
        assert e.value.field == field
    from ttcore.constraints import TokenDFA  # a constraint restricts a joint, not independent marginals

    anything = TokenDFA.of_tokens(torch.zeros(1, 3, dtype=torch.long), torch.tensor([True]))
    with pytest.raises(InvalidSampler, match="joint: false") as e:
        list(generate(model, 2, 2, seed=0, sampler="blocks", joint=False, constraint=anything))
    assert e.value.field == "joint"


def test_the_kind_claims_block_models_and_refuses_the_full_sequence_loop():
    model = _model()
    assert model.cfg.kind is BLOCK_DIFFUSION and model.cfg.kind.base(model.cfg) == "bd3lm"
    assert BLOCK_DIFFUSION.request_defaults(model.cfg) == {"sampler": "blocks"}
    shifted = _model(shifted=True).cfg  # its block's last token is read by the next block only: left to right
    assert shifted.kind.base(shifted) == "sdar"
    assert BLOCK_DIFFUSION.request_defaults(shifted) == {"sampler": "blocks", "ordering": "left_to_right"}
    with pytest.raises(InvalidSampler, match="sampler blocks"):
        list(generate(model, 2, 2, seed=0))
    for settings, field in (({"steps": 3}, "steps"), ({"steps": 6}, "steps"),
                            ({"steps": 1, "block_eb_gamma": 0.5}, "steps"),
                            ({"prompt": torch.tensor([3, 3, 0, 3])}, "prompt")):
        steps = settings.pop("steps", 2)
        with pytest.raises(InvalidSampler) as e:
            list(generate(model, 2, steps, seed=0, sampler="blocks", **settings))
        assert e.value.field == field, e.value
    with pytest.raises(InvalidSampler, match="sampler blocks") as e:  # a block setting on another sampler
        SamplerConfig(block_eb_gamma=0.5)
    assert e.value.field == "block_eb_gamma"
    with pytest.raises(ValueError, match="divide the length"):
        DiTConfig(vocab_size=4, out_vocab=3, length=6, block_size=4)
    loss = block_diffusion_loss(model.train(), torch.randint(0, 3, (4, 4)), 3,
                                generator=torch.Generator().manual_seed(0))
    loss["loss"].backward()
    assert torch.isfinite(loss["loss"]) and model.head.proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("shifted", [False, True])
def test_the_cache_gives_each_block_the_full_forwards_features(shifted):
    """In float64, rows at different blocks in one call: the current block's features over each row's cache of
    committed blocks (the clean blocks it does not yet hold run in the same call, the rest are pads) equal the full
    forward's (the block noised, the later ones anything), zero elsewhere; the cache then holds the committed
    blocks, and the next block's step reads it."""
    from ttcore.models.block_cache import block_step_features, empty_cache

    model = _model(length=8, shifted=shifted).double()
    x0 = torch.randint(0, 3, (4, 8))
    x_t = torch.where(torch.rand(4, 8) < 0.5, torch.full_like(x0, 3), x0)
    block = torch.tensor([0, 1, 3, 2])  # each row's current block
    with torch.no_grad():
        cache = empty_cache(model, 4, "cpu")
        cache.filled = torch.tensor([0, 0, 2, 4])  # row 2 holds block 0, row 3 blocks 0-1 (from earlier steps)
        for row, held in ((2, 2), (3, 4)):  # those keys as earlier steps wrote them
            single = empty_cache(model, 1, "cpu")
            block_step_features(model, single, x0[row:row + 1], torch.tensor([held + 2]))
            for (k, v), (k1, v1) in zip(cache.layers, single.layers):
                k[row, :, :held], v[row, :, :held] = k1[0, :, :held], v1[0, :, :held]
        for step in range(2):  # the block, then (rows moved one block on) the next one, over the kept cache
            end = 2 * block + 2
            view = torch.where(torch.arange(8)[None] < (end - 2)[:, None], x0,
                               torch.where(torch.arange(8)[None] < end[:, None], x_t, torch.randint(0, 4, (4, 8))))
            h = block_step_features(model, cache, view, end)
            full = model.features(view)
            inside = (torch.arange(8)[None] // 2) == block[:, None]
            assert torch.allclose(h[inside], full[inside], atol=1e-10) and (h[~inside] == 0).all()
            assert torch.equal(cache.filled, end - 2)
            if step == 0:
                keep = block < 3  # the last block's row takes another step of it
                block, x_t = torch.where(keep, block + 1, block), torch.where(torch.rand(4, 8) < 0.5, 3, x0)
        with pytest.raises(ValueError, match="whole committed blocks"):
            block_step_features(model, cache, x0, torch.full((4,), 2))  # behind what the cache holds


@pytest.mark.parametrize("precision,shifted", [("fp32", False), ("bf16", False), ("fp32", True)])
def test_a_run_over_the_cache_draws_what_it_draws_without_one(precision, shifted):
    """``sampler: blocks`` over the block cache and without it (the prefix's forward each step) give the same
    tokens (float64: exactly; bf16 autocast: the cache's buffers in bf16, the run finishes), prompts included, and
    a run whose cache was dropped (as the service drops a run that sits out a step) carries on the same."""
    from ttcore.sampling import GenerationRun, SamplerConfig

    model = _model(length=8, shifted=shifted).double() if precision == "fp32" else _model(length=8)
    model.precision = precision
    eb = {"block_eb_gamma": 0.3, "sampler": "blocks"}  # rows of one run at different blocks
    for steps, prompt, settings in ((4, None, {}), (8, torch.tensor([1, 2, 0, 3, 3, 3, 3, 3]), {}),
                                    (4, torch.tensor([1] + [3] * 7), {}), (8, None, {"ordering": "margin"}),
                                    (8, None, eb), (6, torch.tensor([1] + [3] * 7), eb)):
        config = SamplerConfig(**{"sampler": "blocks", **settings})
        runs = [GenerationRun(model, 5, steps, config, seed=3, prompt=prompt, kv_cache=cached)
                for cached in (True, False)]
        with model.compute_context():
            while not runs[0].done:
                for run in runs:
                    run.skip_idle_steps()
                    run.step()
                if runs[0].step_index == 2:
                    runs[0].kv = None
        if precision == "fp32":
            assert torch.equal(runs[0].tokens, runs[1].tokens), (steps, prompt)
        assert runs[0].done and (runs[0].tokens != 3).all()


def test_a_stop_token_ends_each_sequence_at_the_block_that_draws_it():
    """``stop_token`` (text's end-of-text): each sequence's tokens are those of the run without it up to the end of
    the first block holding the token, the token after; a run whose every sequence stopped in its first block
    makes one model call; a constraint, a full-sequence model or an id that is no token is refused naming it."""
    from ttcore.constraints import TokenDFA
    from ttcore.sampling import GenerationRun, SamplerConfig

    model = _model(length=8)
    free = _draw(model, 300, 1, seed=3)
    run = GenerationRun(model, 300, 4, SamplerConfig(sampler="blocks"), seed=3, stop_token=0)
    while not run.done:
        run.step()
    hit = (free.view(300, 4, 2) == 0).any(2)
    ends = 2 * (torch.where(hit.any(1), hit.int().argmax(1), 3) + 1)  # each row's end: its first block holding 0
    keep = torch.arange(8)[None] < ends[:, None]
    assert torch.equal(run.tokens[keep], free[keep]) and bool((run.tokens[~keep] == 0).all())
    assert 0.2 < float((ends < 8).float().mean()) < 1  # some rows stop early, not all
    seed = next(s for s in range(100) if bool((_draw(model, 1, 1, seed=s)[0, :2] == 0).any()))
    early = GenerationRun(model, 1, 4, SamplerConfig(sampler="blocks"), seed=seed, stop_token=0)
    while not early.done:
        early.step()
    assert early.model_calls == 1 and bool((early.tokens[0, 2:] == 0).all())
    anything = TokenDFA.of_tokens(torch.zeros(1, 3, dtype=torch.long), torch.tensor([True]))
    full = JointModel(ModelConfig(DiTConfig(vocab_size=4, out_vocab=3, length=4, hidden_dim=32, cond_dim=16,
                                            n_blocks=1, n_heads=2), "none", 1, "1layer")).eval()
    for mdl, steps, kw in ((model, 4, {"constraint": anything}), (full, 4, {}), (model, 4, {"stop_token": 3})):
        with pytest.raises(InvalidSampler) as e:
            GenerationRun(mdl, 1, steps, SamplerConfig(sampler="blocks" if mdl is model else None), seed=0,
                          **{"stop_token": 0, **kw})
        assert e.value.field == "stop_token"


def test_blocks_of_one_token_are_an_autoregressive_model():
    """b = 1: the exact likelihood is the chain rule of next-token laws, log p(x) = sum_i log p(x^i | x^{<i}), each
    computed directly (position i masked, the later ones anything: block-causal reads none of them), and one step
    a block (one token a step, left to right) draws that law (chi-square of 20,000 draws over all 81)."""
    model = _model("none", 1, block=1)
    every = torch.tensor(list(itertools.product(range(3), repeat=4)))
    direct = torch.zeros(81, dtype=torch.float64)
    with torch.no_grad():
        for i in range(4):
            x_t = torch.where(torch.arange(4)[None] >= i, 3, every)
            at = torch.zeros_like(every, dtype=torch.bool)
            at[:, i] = True
            logp = torch.log_softmax(model.head_outputs(model.features(x_t), at).logits.double(), -1)
            direct += logp.gather(1, every[:, i:i + 1])[:, 0]
        assert torch.allclose(block_log_prob(model, every), direct, atol=1e-5)
        assert torch.allclose(block_chain_log_prob(model, every), direct, atol=1e-5)  # one step a block is b steps
    drawn = _draw(model, N_DRAWS, 1, seed=2)
    counts = torch.bincount((drawn * torch.tensor([27, 9, 3, 1])).sum(1), minlength=81).double()
    assert chisquare(counts.numpy(), (direct.exp() / direct.exp().sum() * N_DRAWS).numpy()).pvalue > 1e-3


def test_admission_counts_what_the_block_cache_holds():
    """``cost.kv_cache_row_bytes`` of a block model is its cache's bytes a sequence (float32 buffers), and a step's
    memory a sequence (``forward_row_bytes``, what admission divides its budget by) counts two copies of it (held
    between steps, copied when runs step together)."""
    from ttcore.models.block_cache import empty_cache
    from ttcore.sampling import cost

    model = _model(length=8)
    with torch.no_grad():
        cache = empty_cache(model, 3, "cpu")
    held = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in cache.layers) // 3
    assert cost.kv_cache_row_bytes(model.cfg, copies=1) == held > 0
    assert cost.forward_row_bytes(model.cfg) == cost.FORWARD_BYTES_PER_TOKEN_WIDTH * 8 * 32 + 2 * held


def test_constrained_runs_at_different_blocks_step_together():
    """Two constrained runs with the same settings, one two blocks ahead, stepped together (one group, as the
    service steps requests): each gets the tokens it gets alone, every sequence in the language (a row's automaton
    is started by its own committed blocks only, not by positions of a later block that another row has reached)."""
    from ttcore.constraints import TokenDFA
    from ttcore.sampling import GenerationRun, SamplerConfig, batch_step

    model = _model("tt", 2, length=8)
    delta = torch.tensor([[-1, 1, 2], [1, 1, 2], [2, 2, 1]])
    dfa = TokenDFA.of_tokens(delta, torch.tensor([False, True, False]))
    runs = [GenerationRun(model, 3, 4, SamplerConfig(sampler="blocks"), seed=s, constraint=dfa) for s in (1, 2)]
    alone = [list(generate(model, 3, 4, seed=s, sampler="blocks", constraint=dfa))[-1].tokens for s in (1, 2)]
    runs[0].step(), runs[0].step()
    while not all(r.done for r in runs):
        batch_step(model, [r for r in runs if not r.done])
    assert all(torch.equal(r.tokens, a) for r, a in zip(runs, alone))
    assert all(bool(((r.tokens[:, 0] != 0) & ((r.tokens == 2).sum(1) % 2 == 0)).all()) for r in runs)
