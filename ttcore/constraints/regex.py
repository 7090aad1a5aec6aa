"""A regular expression as a ``TokenDFA`` over a model's tokens: the decoded text must match it whole (Python's
``re.fullmatch``). The expression becomes a character automaton by ``interegular`` (a pure-Python regex-to-FSM
library, the one outlines used before its Rust core; we chose it over ``outlines-core`` 0.2.14, whose token index
dropped the transition into an optional group here: ``C(\\(O\\))?`` accepted "C" but not "C(O)"); each token then
moves every state through its characters at once (the same characters for every state: one vectorized walk a
character position). A token whose text is not whole characters (a byte-level piece of one) or is empty is never
allowed."""

import interegular
import numpy as np
import torch

from .dfa import ConstraintError, TokenDFA

MAX_PATTERN = 1000  # characters of a pattern


def char_automaton(pattern: str):
    """interegular's reduced FSM of ``pattern``: (table [Q, S] int, -1 where it rejects; the alphabet; accepting
    [Q] bool; the initial state's row). Raises ``ConstraintError`` for a pattern it cannot read."""
    if not pattern:
        raise ConstraintError("the pattern is empty")
    if len(pattern) > MAX_PATTERN:
        raise ConstraintError(f"the pattern has {len(pattern)} characters, more than {MAX_PATTERN}")
    try:
        fsm = interegular.parse_pattern(pattern).to_fsm().reduce()
    except Exception as e:  # noqa: BLE001 (its parser raises several kinds): the caller answers 422
        raise ConstraintError(f"not a regular expression this server reads: {type(e).__name__}: {e}") from None
    states = sorted(fsm.states, key=lambda s: (s != fsm.initial, s))  # the initial state first
    row = {s: i for i, s in enumerate(states)}
    symbols = sorted(set(fsm.alphabet.values()))
    col = {s: j for j, s in enumerate(symbols)}
    table = np.full((len(states), len(symbols)), -1, dtype=np.int64)
    for s, moves in fsm.map.items():
        for sym, nxt in moves.items():
            table[row[s], col[sym]] = row[nxt]
    accepting = np.array([s in fsm.finals for s in states])
    return table, (fsm.alphabet, col), accepting


def regex_dfa(pattern: str, pieces: list[str], pad_id: int | None) -> TokenDFA:
    """The tokens' automaton of ``pattern``: ``pieces`` each token's text (``tokenizer.pieces``), ``pad_id`` the
    model's end padding (allowed only after an accepted text). -> a finished ``TokenDFA``."""
    table, (alphabet, col), accepting = char_automaton(pattern)
    q_n, v = table.shape[0], len(pieces)
    usable = [i != pad_id and p != "" and "\ufffd" not in p for i, p in enumerate(pieces)]
    longest = max((len(p) for p, ok in zip(pieces, usable) if ok), default=0)
    chars = np.full((v, longest), -2, dtype=np.int64)  # -2: past the token's end
    for i, (p, ok) in enumerate(zip(pieces, usable)):
        if ok:
            chars[i, :len(p)] = [col[alphabet[ch]] for ch in p]
    state = np.broadcast_to(np.arange(q_n)[:, None], (q_n, v)).copy()  # [Q, V]
    state[:, ~np.array(usable)] = -1
    for k in range(longest):
        sym = chars[:, k]  # [V]
        going = (state >= 0) & (sym >= 0)[None]
        state = np.where(going, table[state.clip(0), sym.clip(0)[None].repeat(q_n, 0)], state)
    dfa = TokenDFA(torch.from_numpy(state), torch.from_numpy(accepting))
    return dfa.finish(pad_id)
