"""A chain joint times a deterministic automaton (``ttcore.distributions.automaton``) against brute-force
enumeration: every sequence's probability from the dense joint, the automaton run on it token by token."""

import numpy as np
import pytest
import torch
from brute import all_sequences, chi_square_pvalue, dense_cp, dense_tt

from ttcore.distributions import Streams, tt_cores_from_logits
from ttcore.distributions.automaton import (
    Automata,
    class_sums,
    constrained_marginals,
    constrained_sample,
    log_acceptance,
    log_accepted_mass,
)

L, V, R, Q = 4, 3, 2, 3


def _automaton(seed: int):
    """A random partial DFA on V tokens with Q states (about a third of the transitions reject), start 0,
    accepting {1, 2} at random but never empty."""
    g = torch.Generator().manual_seed(seed)
    delta = torch.randint(0, Q, (Q, V), generator=g)
    delta[torch.rand(Q, V, generator=g) < 0.3] = -1
    accepting = torch.rand(Q, generator=g) < 0.5
    accepting[1] = True
    return delta, accepting


def _rows(delta, accepting, n: int = 1) -> Automata:
    """One automaton (token-level delta [Q, V]) for n rows, its token classes computed once."""
    one = Automata.of_tokens(delta[None], accepting[None])
    return Automata(one.delta.expand(n, -1, -1), one.accepting.expand(n, -1), one.token_class.expand(n, -1))


def _accepted(delta, accepting, seqs) -> np.ndarray:
    out = []
    for s in seqs.tolist():
        q = 0
        for x in s:
            q = int(delta[q, x]) if q >= 0 else -1
        out.append(q >= 0 and bool(accepting[q]))
    return np.array(out)


def _chains(kind: str, seed: int):
    """(start [1, r], cores, diagonal, dense p over all V^L sequences) for a TT, a CP and a rank-1 chain, with
    position 2 known (token 1) as a served step's chain has it."""
    g = torch.Generator().manual_seed(seed)
    seqs = all_sequences(L, V).numpy()
    if kind == "tt":
        cores = tt_cores_from_logits(torch.randn(1, L, V, R, R, generator=g, dtype=torch.float64))
        cores[0, 2] = 0
        cores[0, 2, 1] = torch.eye(R, dtype=torch.float64)
        return torch.full((1, R), 1 / R, dtype=torch.float64), cores, False, dense_tt(cores[0].numpy(), seqs)
    r = R if kind == "cp" else 1
    weights = torch.rand(1, r, generator=g, dtype=torch.float64) + 0.2
    weights /= weights.sum()
    factors = torch.randn(1, L, r, V, generator=g, dtype=torch.float64).softmax(-1)
    factors[0, 2] = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    p = dense_cp(weights[0].numpy(), factors[0].numpy(), seqs)
    return weights, factors.transpose(2, 3).contiguous(), True, p


@pytest.mark.parametrize("kind", ["tt", "cp", "rank1"])
@pytest.mark.parametrize("seed", [0, 1])
def test_acceptance_and_marginals_against_enumeration(kind, seed):
    start, cores, diagonal, p = _chains(kind, seed)
    delta, accepting = _automaton(seed)
    seqs = all_sequences(L, V).numpy()
    keep = _accepted(delta, accepting, seqs)
    z = p[keep].sum()
    assert z > 0
    automata = _rows(delta, accepting)
    assert log_acceptance(start, class_sums(cores, automata), automata, diagonal).item() == \
        pytest.approx(np.log(z), abs=1e-10)
    marginals = constrained_marginals(start, cores, automata, diagonal)[0].numpy()
    for i in range(L):
        want = np.array([p[keep & (seqs[:, i] == x)].sum() for x in range(V)]) / z
        np.testing.assert_allclose(marginals[i], want, atol=1e-10)


@pytest.mark.parametrize("kind", ["tt", "cp"])
def test_draws_follow_the_joint_restricted_to_the_language(kind):
    """20,000 draws of the whole sequence (chi-square against p(x | x in L)); none rejected; the same uniforms
    give the same draws row by row whatever the batch (rows are independent)."""
    start, cores, diagonal, p = _chains(kind, 3)
    delta, accepting = _automaton(3)
    seqs = all_sequences(L, V).numpy()
    keep = _accepted(delta, accepting, seqs)
    n = 20_000
    u = Streams.of_request(5, n).uniform(4, 2 * L + 1)
    draws = constrained_sample(start.expand(n, -1), cores.expand(n, *cores.shape[1:]), _rows(delta, accepting, n), u,
                               diagonal)
    assert _accepted(delta, accepting, draws.numpy()).all()
    assert chi_square_pvalue(draws.numpy(), np.where(keep, p, 0) / p[keep].sum(), seqs) > 1e-3
    few = constrained_sample(start.expand(3, -1), cores.expand(3, *cores.shape[1:]), _rows(delta, accepting, 3),
                             u[-3:], diagonal)
    assert torch.equal(few, draws[-3:])


def _accepted_from(delta, accepting, start, seqs) -> np.ndarray:
    out = []
    for s in seqs.tolist():
        q = start
        for x in s:
            q = int(delta[q, x]) if q >= 0 else -1
        out.append(q >= 0 and bool(accepting[q]))
    return np.array(out)


@pytest.mark.parametrize("kind", ["tt", "cp"])
def test_rows_of_one_automaton_at_their_own_start_and_accepting_states_each_get_their_own_law(kind):
    """A block step's automata: one automaton's transitions for every row (expanded, reckoned once over the rows'
    union), each row started in its own state and accepting in its own states (``Automata.start``). Each row's
    acceptance and marginals against enumeration, the same with the transitions copied per row, and 10,000 draws
    of each of two rows' laws in one batch (chi-square)."""
    start, cores, diagonal, p = _chains(kind, 2)
    delta, accepting = _automaton(2)
    seqs = all_sequences(L, V).numpy()
    one = Automata.of_tokens(delta[None], accepting[None])
    starts = torch.tensor([0, 1, 2, 1])
    accepts = torch.stack([accepting, accepting, torch.tensor([True, True, False]), torch.tensor([False, True, True])])
    n = len(starts)
    shared = Automata(one.delta.expand(n, -1, -1), accepts, one.token_class.expand(n, -1), starts)
    copied = Automata(one.delta.expand(n, -1, -1).clone(), accepts, one.token_class.expand(n, -1).clone(), starts)
    rows_start, rows_cores = start.expand(n, -1), cores.expand(n, *cores.shape[1:])
    for automata in (shared, copied):
        logz = log_acceptance(rows_start, class_sums(rows_cores, automata), automata, diagonal)
        marginals = constrained_marginals(rows_start, rows_cores, automata, diagonal).numpy()
        for r in range(n):
            keep = _accepted_from(delta, accepts[r], int(starts[r]), seqs)
            z = p[keep].sum()
            assert z > 0 and logz[r].item() == pytest.approx(np.log(z), abs=1e-10)
            for i in range(L):
                want = np.array([p[keep & (seqs[:, i] == x)].sum() for x in range(V)]) / z
                np.testing.assert_allclose(marginals[r, i], want, atol=1e-10)
    m = 10_000
    pick = torch.tensor([2, 3]).repeat_interleave(m)
    u = Streams.of_request(9, 2 * m).uniform(4, 2 * L + 1)
    many = Automata(one.delta.expand(2 * m, -1, -1), accepts[pick], one.token_class.expand(2 * m, -1), starts[pick])
    draws = constrained_sample(start.expand(2 * m, -1), cores.expand(2 * m, *cores.shape[1:]), many, u,
                               diagonal).numpy()
    for half, r in ((slice(0, m), 2), (slice(m, None), 3)):
        keep = _accepted_from(delta, accepts[r], int(starts[r]), seqs)
        assert _accepted_from(delta, accepts[r], int(starts[r]), draws[half]).all()
        assert chi_square_pvalue(draws[half], np.where(keep, p, 0) / p[keep].sum(), seqs) > 1e-3


def test_class_sums_and_row_normalized_cores_agree_in_every_layout_and_path():
    """``class_sums`` (a matmul for rows sharing few classes, a scatter otherwise) against a direct sum per class,
    on cores in the head's layout ([x, j, k] with x fastest, as ``TTHead.core_logits`` gives them) and contiguous;
    ``tt_cores_from_logits`` gives the same row-stochastic cores from either layout."""
    g = torch.Generator().manual_seed(5)
    n, l, v, r = 3, 2, 7, 4
    raw = torch.randn(n, l, r, r, v, generator=g, dtype=torch.float64)  # the head's memory: [j, k, x]
    head_layout = raw.permute(0, 1, 4, 2, 3)  # [n, l, x, j, k], x of stride 1
    cores = tt_cores_from_logits(head_layout)
    np.testing.assert_allclose(cores.numpy(), tt_cores_from_logits(head_layout.contiguous()).numpy(), atol=1e-14)
    np.testing.assert_allclose(cores.sum((2, 4)).numpy(), np.ones((n, l, r)), atol=1e-12)
    token_class = torch.tensor([2, 0, 1, 0, 2, 2, 1])
    delta = torch.zeros(1, 2, 3, dtype=torch.long)
    shared_rows = Automata(delta.expand(n, -1, -1), torch.ones(n, 2, dtype=torch.bool), token_class.expand(n, -1))
    copied = Automata(delta.expand(n, -1, -1).clone(), shared_rows.accepting, token_class.expand(n, -1).clone())
    want = torch.stack([cores[:, :, token_class == k].sum(2) for k in range(3)], 2)
    for automata in (shared_rows, copied):
        for layout in (cores, cores.contiguous()):
            np.testing.assert_allclose(class_sums(layout, automata).numpy(), want.numpy(), atol=1e-12)


def test_a_language_the_chain_cannot_reach_gives_zero_and_no_draw():
    """Only token 0 at every position is accepted, but position 2 is known to be token 1: Z = 0, -inf, -1s."""
    start, cores, diagonal, _ = _chains("tt", 0)
    delta = torch.tensor([[0, -1, -1]])
    accepting = torch.tensor([True])
    automata = _rows(delta, accepting)
    assert log_acceptance(start, class_sums(cores, automata), automata) == -np.inf
    u = torch.rand(1, 2 * L + 1, dtype=torch.float64)
    assert (constrained_sample(start, cores, automata, u) == -1).all()


def test_known_tokens_no_accepted_sequence_agrees_with_give_zero_and_no_draw():
    """The same language through ``known`` (position 2's token 1, which every state rejects): no state is live
    at any position, the accepted mass is 0 (-inf) and the draw is -1s, for every row."""
    start, cores, _, _ = _chains("tt", 0)
    automata = _rows(torch.tensor([[0, -1, -1]]), torch.tensor([True]), 2)
    known = torch.full((2, L), -1)
    known[:, 2] = 1
    starts, rows_cores = start.expand(2, -1), cores.expand(2, *cores.shape[1:])
    assert (log_accepted_mass(starts, class_sums(rows_cores, automata), automata, False, known) == -np.inf).all()
    u = torch.rand(2, 2 * L + 1, dtype=torch.float64)
    assert (constrained_sample(starts, rows_cores, automata, u, known=known) == -1).all()


def _joint(kind: str, seed: int):
    """A format's joint object on L positions (no position known) and its dense p over all V^L sequences."""
    from ttcore.distributions import CP, Factorized, TensorTrain

    g = torch.Generator().manual_seed(seed)
    seqs = all_sequences(L, V).numpy()
    if kind == "tt":
        tt = TensorTrain.from_logits(torch.randn(1, L, V, R, R, generator=g, dtype=torch.float64))
        return tt, dense_tt(tt.cores[0].numpy(), seqs)
    if kind == "cp":
        cp = CP.from_logits(torch.randn(1, R, generator=g, dtype=torch.float64),
                            torch.randn(1, L, R, V, generator=g, dtype=torch.float64))
        return cp, dense_cp(cp.weights[0].numpy(), cp.factors[0].numpy(), seqs)
    f = Factorized.from_logits(torch.randn(1, L, V, generator=g, dtype=torch.float64))
    return f, dense_cp(np.ones(1), f.probs[0, :, None].numpy(), seqs)


@pytest.mark.parametrize("kind", ["tt", "cp", "rank1"])
def test_the_constrained_joint_conditions_scores_and_draws_a_set_as_enumeration_says(kind):
    """``Constrained``: log_prob sums to 1 over the accepted sequences (-inf elsewhere); marginals given x_S
    (position 1 known) are the enumerated p(x^i | x_S, x in L); 20,000 draws of T = {0, 3} follow
    p(x_T | x in L) with positions 1 and 2 summed out (chi-square); the normalizer given x_S is
    p(x_S, x in L)."""
    from ttcore.distributions.automaton import Constrained

    joint, p = _joint(kind, 4)
    delta, accepting = _automaton(4)
    seqs = all_sequences(L, V)
    keep = _accepted(delta, accepting, seqs.numpy())
    c = Constrained(joint, _rows(delta, accepting))
    lp = torch.stack([c.log_prob(s[None])[0] for s in seqs]).numpy()
    assert np.isneginf(lp[~keep]).all() and np.exp(lp[keep]).sum() == pytest.approx(1.0, abs=1e-10)
    x_cond = torch.tensor([[-1, 2, -1, -1]])
    agree = keep & (seqs[:, 1] == 2).numpy()
    assert c.log_normalizer(x_cond).item() == pytest.approx(np.log(p[agree].sum()), abs=1e-10)
    marg = c.marginals(x_cond)[0].numpy()
    for i in range(L):
        want = np.array([p[agree & (seqs[:, i] == x).numpy()].sum() for x in range(V)]) / p[agree].sum()
        np.testing.assert_allclose(marg[i], want, atol=1e-10)
    n = 20_000
    big = type(joint)  # the same joint repeated for n rows
    rows = {"tt": lambda: big(joint.cores.expand(n, -1, -1, -1, -1), validate=False),
            "cp": lambda: big(joint.weights.expand(n, -1), joint.factors.expand(n, -1, -1, -1), validate=False),
            "rank1": lambda: big(joint.probs.expand(n, -1, -1), validate=False)}[kind]()
    many = Constrained(rows, _rows(delta, accepting, n))
    chosen = torch.tensor([[True, False, False, True]]).expand(n, -1)
    drawn = many.sample(chosen, Streams.of_request(11, n))
    assert (drawn[:, [1, 2]] == -1).all()
    outcomes = np.array([(a, b) for a in range(V) for b in range(V)])
    want = np.array([p[keep & (seqs[:, 0] == a).numpy() & (seqs[:, 3] == b).numpy()].sum() for a, b in outcomes])
    assert chi_square_pvalue(drawn[:, [0, 3]].numpy(), want / want.sum(), outcomes) > 1e-3


@pytest.mark.parametrize("kind", ["tt", "cp"])
def test_tokens_that_move_the_automaton_alike_share_a_class_and_keep_their_own_probabilities(kind):
    """Six tokens whose transitions repeat three columns (two tokens a class): the messages run over 3 classes,
    and the marginals per token and 20,000 draws still follow the enumerated p(x | x in L), on 3 positions."""
    from ttcore.distributions import CP, TensorTrain

    l, v = 3, 6
    delta3, accepting = _automaton(5)
    delta = torch.cat([delta3, delta3], 1)  # token x + 3 moves like token x
    automata = _rows(delta, accepting)
    assert automata.num_classes <= 3
    g = torch.Generator().manual_seed(6)
    seqs = all_sequences(l, v).numpy()
    if kind == "tt":
        joint = TensorTrain.from_logits(torch.randn(1, l, v, R, R, generator=g, dtype=torch.float64))
        p = dense_tt(joint.cores[0].numpy(), seqs)
        start, cores, diagonal = torch.full((1, R), 1 / R, dtype=torch.float64), joint.cores, False
    else:
        joint = CP.from_logits(torch.randn(1, R, generator=g, dtype=torch.float64),
                               torch.randn(1, l, R, v, generator=g, dtype=torch.float64))
        p = dense_cp(joint.weights[0].numpy(), joint.factors[0].numpy(), seqs)
        start, cores, diagonal = joint.weights, joint.factors.transpose(2, 3), True
    keep = _accepted(delta, accepting, seqs)
    want = np.where(keep, p, 0) / p[keep].sum()
    marg = constrained_marginals(start, cores, automata, diagonal)[0].numpy()
    for i in range(l):
        np.testing.assert_allclose(marg[i], [want[seqs[:, i] == x].sum() for x in range(v)], atol=1e-10)
    n = 20_000
    draws = constrained_sample(start.expand(n, -1), cores.expand(n, *cores.shape[1:]), _rows(delta, accepting, n),
                               Streams.of_request(2, n).uniform(4, 2 * l + 1), diagonal)
    assert chi_square_pvalue(draws.numpy(), want, seqs) > 1e-3
