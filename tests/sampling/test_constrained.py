"""Constrained steps (``ttcore.sampling.constrained``) on tiny real models: one step's draw against the model's
joint restricted to the language and enumerated, alone and batched with unconstrained runs; every step kind's
finished samples accepted; unconstrained runs unchanged beside constrained ones."""

import functools
import itertools

import numpy as np
import pytest
import torch
from brute import chi_square_pvalue
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import run_together, tiny_model

from ttcore.constraints import ConstraintError, TokenDFA
from ttcore.sampling import GenerationRun, SamplerConfig, batch_step
from ttcore.sampling.joint_step import joint_distribution

V, L = 3, 5


def _parity() -> TokenDFA:
    """Sequences over {0, 1, 2} with an even number of 1s and no 2 right after a 2 (states: parity x last=2)."""
    delta = torch.full((4, V), -1)
    for parity in (0, 1):
        for last2 in (0, 1):
            q = 2 * parity + last2
            delta[q, 0] = 2 * parity
            delta[q, 1] = 2 * (1 - parity)
            if not last2:
                delta[q, 2] = 2 * parity + 1
    return TokenDFA.of_tokens(delta, torch.tensor([True, True, False, False]))


def _enumerated_step(model, x_t, chosen, dfa):
    """p(x_T | x_t, x in L) over every assignment of T, from the model's joint at x_t (temperature 1, the full
    head outputs) enumerated over the masked positions."""
    mask_id = model.cfg.dit.vocab_size - 1
    masked = x_t == mask_id
    with torch.no_grad():
        joint = joint_distribution(model, model.features(x_t).float(), x_t, masked, 1.0)
    free = masked[0].nonzero()[:, 0].tolist()
    t_pos = chosen[0].nonzero()[:, 0].tolist()
    law = {}
    for fill in itertools.product(range(V), repeat=len(free)):
        x = x_t[0].clone()
        x[free] = torch.tensor(fill)
        if dfa.accepts(x.tolist()):
            key = tuple(x[t_pos].tolist())
            law[key] = law.get(key, 0.0) + joint.log_prob(x[None]).exp().item()
    outcomes = np.array(list(itertools.product(range(V), repeat=len(t_pos))))
    p = np.array([law.get(tuple(o), 0.0) for o in outcomes])
    return p / p.sum(), outcomes, t_pos


@pytest.mark.parametrize("decomposition,rank", [("none", 1), ("cp", 3), ("tt", 2)])
def test_a_constrained_step_draws_the_joint_restricted_to_the_language(decomposition, rank):
    """From x_t = (1, M, M, M, M) a left-to-right step of 2 positions of a 2-step run: 3,000 sequences (in one
    run, batched beside an unconstrained run) follow the enumerated p(x_T | x_t, x in L) (chi-square), T = {1, 2}
    summed over positions 3 and 4 through the automaton."""
    model = tiny_model(decomposition, V, L, rank, perturb=0.5, noise=0.5)
    dfa = _parity()
    mask_id = model.cfg.dit.vocab_size - 1
    x_t = torch.tensor([[1, mask_id, mask_id, mask_id, mask_id]])
    config = SamplerConfig(ordering="left_to_right")
    n = 3000
    run = GenerationRun(model, n, 2, config, seed=3, prompt=x_t[0], constraint=dfa)
    other = GenerationRun(model, 4, 2, config, seed=4, prompt=x_t[0])
    with torch.no_grad():
        batch_step(model, [other, run])
    committed = (run.tokens != mask_id) & (x_t == mask_id)
    chosen = committed[:1]
    assert (committed == chosen).all() and int(chosen.sum()) == 2
    p, outcomes, t_pos = _enumerated_step(model, x_t, chosen, dfa)
    assert chi_square_pvalue(run.tokens[:, t_pos].numpy(), p, outcomes) > 1e-3


SETTINGS = [SamplerConfig(), SamplerConfig(ordering="top_prob"),
            SamplerConfig(ordering="top_prob", adaptive_path="fast"), SamplerConfig(eb_gamma=0.5),
            SamplerConfig(eb_gamma=0.5, adaptive_path="fast"), SamplerConfig(temperature=0.7)]


@pytest.mark.parametrize("config", SETTINGS, ids=lambda c: c.step.__class__.__name__ + f"-{c.ordering}-{c.temperature}")
@pytest.mark.parametrize("decomposition,rank", [("none", 1), ("cp", 3), ("tt", 2)])
def test_every_step_kind_finishes_inside_the_language_and_alone_equals_batched(config, decomposition, rank):
    model = tiny_model(decomposition, V, L, rank, perturb=0.5, noise=0.5)
    dfa = _parity()
    with torch.no_grad():
        alone = run_together(model, [GenerationRun(model, 40, 3, config, seed=1, constraint=dfa)])[0].tokens
        free_alone = run_together(model, [GenerationRun(model, 6, 3, config, seed=2)])[0].tokens
        both = run_together(model, [GenerationRun(model, 6, 3, config, seed=2),
                                    GenerationRun(model, 40, 3, config, seed=1, constraint=dfa)])
    assert dfa.accepts_all(alone).all()
    assert torch.equal(both[1].tokens, alone)  # batch-invariant with a constraint
    assert torch.equal(both[0].tokens, free_alone)  # an unconstrained run is unchanged beside a constrained one


def test_an_unsatisfiable_prompt_and_a_sampler_that_cannot_constrain_are_refused():
    model = tiny_model("tt", V, L, 2, perturb=0.5, noise=0.5)
    mask_id = model.cfg.dit.vocab_size - 1
    with pytest.raises(ConstraintError, match="agrees with the prompt"):  # 2, 2 is never allowed
        GenerationRun(model, 2, 2, prompt=torch.tensor([2, 2, mask_id, mask_id, mask_id]), constraint=_parity())
    with pytest.raises(ConstraintError, match="joint: false"):
        GenerationRun(model, 2, 2, SamplerConfig(joint=False), constraint=_parity())


def test_a_row_whose_joint_underflows_on_the_whole_language_is_rescued_inside_it():
    """At temperature 0.01 a tiny TT's tempered cores G^100 round the unlikely tokens to 0 in float64, and a
    language of only such sequences then has no mass: the step draws again with those zeros floored, and the run
    still finishes inside the language (no dead end, no [MASK] left)."""
    model = tiny_model("tt", V, L, 2, perturb=3.0, noise=3.0)
    mask_id = model.cfg.dit.vocab_size - 1
    with torch.no_grad():
        h = model.features(torch.full((1, L), mask_id)).float()
        probs = joint_distribution(model, h, torch.full((1, L), mask_id), torch.ones(1, L, dtype=torch.bool),
                                   1.0).marginals(torch.full((1, L), -1))[0]  # [L, V]
    rare = int(probs.mean(0).argmin())
    delta = torch.full((1, V), -1)
    delta[0, rare] = 0
    only = TokenDFA.of_tokens(delta, torch.tensor([True]))  # the rare token everywhere
    with torch.no_grad():
        done = run_together(model, [GenerationRun(model, 4, 2, SamplerConfig(temperature=0.01), seed=0,
                                                  constraint=only)])[0]
    assert (done.tokens == rare).all()


PIECES = ["a", "b", "ab"]  # the tiny model's three tokens read as text (no padding: every position is text)
_atoms = st.sampled_from(["a", "b", "ab", "[ab]", "(a|bb)", "b?", "."])
_regexes = st.recursive(_atoms, lambda inner: st.one_of(
    st.tuples(inner, inner).map("".join),
    st.tuples(inner, st.sampled_from(["*", "+", "?", "{1,3}"])).map(lambda t: f"({t[0]}){t[1]}"),
    st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})")), max_leaves=5)


@settings(max_examples=25, deadline=None)
@given(pattern=_regexes, adaptive=st.booleans(), seed=st.integers(0, 1000))
def test_every_sample_of_a_fuzzed_regex_matches_it(pattern, adaptive, seed):
    """Fuzzed regexes over the tokens' texts: whenever some 5-token sequence matches, every sample of a TT run
    constrained by it (random order or the fast adaptive path) matches it whole."""
    import re

    from ttcore.constraints import regex_dfa

    model = _fuzz_model()
    try:
        dfa = regex_dfa(pattern, PIECES, None)
    except ConstraintError:
        return  # no token string matches at all
    if not dfa.satisfiable(torch.full((1, L), -1)).item():
        return  # none of length 5
    config = SamplerConfig(ordering="top_prob", adaptive_path="fast") if adaptive else SamplerConfig()
    with torch.no_grad():
        done = run_together(model, [GenerationRun(model, 8, 3, config, seed=seed, constraint=dfa)])[0]
    for row in done.tokens.tolist():
        assert re.fullmatch(pattern, "".join(PIECES[i] for i in row)), (pattern, row)


@functools.cache
def _fuzz_model():
    return tiny_model("tt", V, L, 2, perturb=0.5, noise=0.5)


@pytest.mark.parametrize("decomposition,rank", [("cp", 3), ("tt", 2)])
def test_the_log_normalizer_is_a_log_probability_at_every_temperature_and_row_by_row(decomposition, rank):
    """log p_T(x in L) of the tempered joint (T = 1 and 0.5 in one batch; a TT's tempered train is not
    row-stochastic), against each row's joint enumerated alone at its own temperature and normalized: exact for
    every row whatever the other row's temperature, 0 for an automaton that accepts everything, and
    ``log_prob`` sums to 1 over the language."""
    from ttcore.distributions.automaton import Automata, Constrained
    from ttcore.sampling.constrained import batch_automaton

    model = tiny_model(decomposition, V, L, rank, perturb=0.5, noise=0.5)
    mask_id = model.cfg.dit.vocab_size - 1
    x_t = torch.tensor([[1, mask_id, mask_id, mask_id, mask_id]] * 2)
    masked = x_t == mask_id
    temps = torch.tensor([1.0, 0.5], dtype=torch.float64)
    everything = TokenDFA.of_tokens(torch.zeros(1, V, dtype=torch.long), torch.tensor([True]))
    fills = [torch.tensor(f) for f in itertools.product(range(V), repeat=L - 1)]
    with torch.no_grad():
        h = model.features(x_t).float()
        for dfa in (_parity(), everything):
            automata: Automata = batch_automaton([dfa], [2], x_t.device)
            dist = Constrained(joint_distribution(model, h, x_t, masked, temps), automata,
                               torch.where(masked, -1, x_t))
            got = dist.log_normalizer()
            for row, temperature in enumerate(temps.tolist()):
                alone = joint_distribution(model, h[row:row + 1], x_t[row:row + 1], masked[row:row + 1], temperature)
                seqs = torch.stack([torch.cat([x_t[row, :1], f]) for f in fills])
                w = torch.cat([alone.log_prob(s[None]) for s in seqs]).double().exp()  # each tempered value
                inside = torch.tensor([dfa.accepts(s.tolist()) for s in seqs])
                want = float((w[inside].sum() / w.sum()).log())
                assert float(got[row]) == pytest.approx(want, abs=1e-5), (dfa.num_states, row)
            total = sum(dist.log_prob(torch.stack([s, s])).double().exp() for s in seqs)  # [2]
            assert torch.allclose(total, torch.ones(2, dtype=torch.float64), atol=1e-5), total
            if dfa is everything:
                assert got.abs().max() < 1e-6
