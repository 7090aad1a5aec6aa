"""Regular expressions as token automata (``ttcore.constraints.regex``): accepted exactly when Python's
``re.fullmatch`` matches the decoded text (fuzzed regexes and token strings), padding only at the end, and the
refusals a server answers 422 with."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ttcore.constraints import ConstraintError, regex_dfa

PIECES = ["[PAD]", "a", "b", "ab", "ba", "aab", "c", "1", "12", "-", "b-", "\ufffd"]  # 0 is the padding
PAD = 0

atoms = st.sampled_from(["a", "b", "c", "1", "-", "[ab]", "[0-9]", "\\d", "(ab|c)", "(a|1-)", "."])
regexes = st.recursive(atoms, lambda inner: st.one_of(
    st.tuples(inner, inner).map("".join),
    st.tuples(inner, st.sampled_from(["*", "+", "?", "{1,2}"])).map(lambda t: f"({t[0]}){t[1]}"),
    st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})")), max_leaves=6)


def _text(ids):
    return "".join(PIECES[i] for i in ids if i != PAD)


@settings(max_examples=60, deadline=None)
@given(pattern=regexes, seqs=st.lists(st.lists(st.integers(0, len(PIECES) - 2), min_size=1, max_size=6),
                                      min_size=20, max_size=20))
def test_token_sequences_are_accepted_exactly_when_the_text_fullmatches(pattern, seqs):
    try:
        dfa = regex_dfa(pattern, PIECES, PAD)
    except ConstraintError:  # an empty language over these tokens: no token string may match
        for s in seqs:
            assert re.fullmatch(pattern, _text(s)) is None or PAD in s
        return
    for s in seqs:
        padded = [i for i in s if i != PAD] + [PAD] * s.count(PAD)  # padding moved to the end
        want = re.fullmatch(pattern, _text(s)) is not None
        assert dfa.accepts(padded) == want, (pattern, s)
        if PAD in s and s.index(PAD) < len(s) - s.count(PAD):  # padding before a token: never accepted
            assert not dfa.accepts(s)


def test_the_replacement_character_and_inner_padding_are_never_allowed():
    dfa = regex_dfa(".+", PIECES, PAD)
    assert dfa.accepts([1, 2, PAD, PAD]) and not dfa.accepts([1, PAD, 2]) and not dfa.accepts([11])
    assert dfa.satisfiable(torch.tensor([[-1, PAD, 1]])).item() is False  # padding then a token: never
    assert dfa.satisfiable(torch.tensor([[-1, -1, PAD]])).item() is True


@pytest.mark.parametrize("pattern,rule", [("", "empty"), ("(ab", "not a regular expression"), ("x+", "empty"),
                                          ("a" * 1001, "more than 1000"), ("[ab]{600}", "more than the limit")])
def test_bad_patterns_are_refused_with_the_rule(pattern, rule):
    with pytest.raises(ConstraintError, match=rule):
        regex_dfa(pattern, PIECES, PAD)
