"""``TokenDFA`` kept over token classes (``ttcore.constraints.dfa``) against brute force on random automata:
the class form reads every token as the [Q, V] table does, through padding, a prefix and trimming;
satisfiability of a template is whether some accepted sequence agrees with it (every sequence enumerated);
the transitions take the smallest integer type; and the server's cache of automata is bounded by bytes."""

import itertools

import pytest
import torch

from service.constraints import AutomatonCache
from ttcore.constraints import ConstraintError, TokenDFA
from ttcore.constraints.dfa import smallest_int

V, L = 4, 4


def _random_table(seed: int, q: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    delta = torch.randint(0, q, (q, V), generator=g)
    delta[torch.rand(q, V, generator=g) < 0.3] = -1
    delta[:, 3] = delta[:, 2]  # two tokens alike: one class
    accepting = torch.rand(q, generator=g) < 0.4
    accepting[-1] = True
    return delta, accepting


def _runs(delta, accepting, ids) -> bool:
    q = 0
    for t in ids:
        q = int(delta[q, t])
        if q < 0:
            return False
    return bool(accepting[q])


@pytest.mark.parametrize("seed", range(6))
def test_the_class_form_reads_every_sequence_as_the_table_does(seed):
    delta, accepting = _random_table(seed)
    try:
        dfa = TokenDFA.of_tokens(delta, accepting).finish(pad_id=0)
    except ConstraintError:
        return
    assert dfa.num_classes < V + 1 and torch.equal(dfa.token_class[2], dfa.token_class[3])
    for ids in itertools.product(range(V), repeat=L):  # the table's language (token 0 now the padding), padded
        body = [t for t in ids if t != 0]
        want = list(ids) == body + [0] * (L - len(body)) and _runs(delta, accepting, body)
        assert dfa.accepts(list(ids)) == want, ids
    assert dfa.moves.dtype == smallest_int(dfa.num_states) == torch.int8


@pytest.mark.parametrize("seed", range(6))
def test_satisfiable_is_whether_an_accepted_sequence_agrees_with_the_template(seed):
    delta, accepting = _random_table(seed)
    try:
        dfa = TokenDFA.of_tokens(delta, accepting).trimmed()
    except ConstraintError:
        return
    accepted = {ids for ids in itertools.product(range(V), repeat=L) if dfa.accepts(list(ids))}
    g = torch.Generator().manual_seed(seed)
    templates = torch.randint(-1, V, (40, L), generator=g)
    templates[:3] = -1
    got = dfa.satisfiable(templates)
    for row, ok in zip(templates.tolist(), got.tolist()):
        want = any(all(t < 0 or t == a for t, a in zip(row, ids)) for ids in accepted)
        assert ok == want, row
        assert dfa.admits(torch.tensor(row)) == want  # the kept answer is the same
    assert dfa.fits(L) == bool(accepted)


def test_a_prefix_is_read_exactly_then_the_language():
    delta, accepting = _random_table(1)
    dfa = TokenDFA.of_tokens(delta, accepting)
    prefixed = dfa.with_prefix([2, 1])
    for ids in itertools.product(range(V), repeat=L):
        assert prefixed.accepts(list(ids)) == (list(ids[:2]) == [2, 1] and dfa.accepts(list(ids[2:]))), ids


def test_the_cache_of_automata_is_bounded_by_bytes_and_drops_the_least_recently_used():
    dfa = TokenDFA.of_tokens(*_random_table(2))
    cache = AutomatonCache(max_bytes=3 * dfa.nbytes)
    for key in "abcd":
        cache.put(key, dfa)
        cache.get("a")  # "a" is used again after each put: "b" goes first
    assert len(cache) == 3 and cache.bytes == 3 * dfa.nbytes and cache.get("b") is None and cache.get("a") is dfa
    AutomatonCache(max_bytes=dfa.nbytes - 1).put("x", dfa)  # larger than the whole cache: never kept
