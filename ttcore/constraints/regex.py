"""A regular expression as a ``TokenDFA`` over a model's tokens: the decoded text must match it whole (Python's
``re.fullmatch``). The expression becomes a character automaton by ``interegular`` (a pure-Python regex-to-FSM
library, the one outlines used before its Rust core; we chose it over ``outlines-core`` 0.2.14, whose token index
dropped the transition into an optional group here: ``C(\\(O\\))?`` accepted "C" but not "C(O)"), built in a child
process with a time and memory limit (``bounded_char_automaton``: a nested counted repetition takes interegular
minutes); each token then moves every state through its characters at once (the same characters for every state:
one vectorized walk a character position). A token whose text is not whole characters (a byte-level piece of one)
or is empty is never allowed."""

import json
import subprocess
import sys

import numpy as np
import torch

from .dfa import ConstraintError, TokenDFA

MAX_PATTERN = 1000  # characters of a pattern
BUILD_SECONDS = 3.0  # a pattern's character automaton must be built within this (in a child process)
BUILD_BYTES = 1 << 30  # and within this much memory


def bounded_char_automaton(pattern: str, seconds: float = BUILD_SECONDS) -> dict:
    """``ttcore.regex_fsm.char_automaton`` in a child process (``python -m ttcore.regex_fsm``: no torch, a
    fraction of a second to start), killed past ``seconds`` and limited to ``BUILD_BYTES``: a stranger's pattern
    cannot hold a server's worker or its memory. Raises ``ConstraintError``."""
    if not pattern:
        raise ConstraintError("the pattern is empty")
    if len(pattern) > MAX_PATTERN:
        raise ConstraintError(f"the pattern has {len(pattern)} characters, more than {MAX_PATTERN}")
    try:
        done = subprocess.run([sys.executable, "-m", "ttcore.regex_fsm", str(BUILD_BYTES)], input=pattern,
                              capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        raise ConstraintError(f"the pattern's automaton takes more than {seconds:g} s to build") from None
    try:
        out = json.loads(done.stdout)
    except ValueError:  # the child died before answering (its memory limit, a signal)
        raise ConstraintError(f"the pattern's automaton could not be built within {BUILD_BYTES >> 20} MB") from None
    if "error" in out:
        raise ConstraintError(out["error"])
    return out


def regex_dfa(pattern: str, pieces: list[str], pad_id: int | None) -> TokenDFA:
    """The tokens' automaton of ``pattern``: ``pieces`` each token's text (``tokenizer.pieces``), ``pad_id`` the
    model's end padding (allowed only after an accepted text). -> a finished ``TokenDFA``."""
    fsm = bounded_char_automaton(pattern)
    table, chars, other = np.array(fsm["table"], dtype=np.int64), fsm["chars"], fsm["other"]
    accepting = np.array(fsm["accepting"], dtype=bool)
    q_n, v = table.shape[0], len(pieces)
    usable = [i != pad_id and p != "" and "\ufffd" not in p for i, p in enumerate(pieces)]
    longest = max((len(p) for p, ok in zip(pieces, usable) if ok), default=0)
    symbols = np.full((v, longest), -2, dtype=np.int64)  # -2: past the token's end
    for i, (p, ok) in enumerate(zip(pieces, usable)):
        if ok:
            symbols[i, :len(p)] = [chars.get(ch, other) for ch in p]
    state = np.broadcast_to(np.arange(q_n)[:, None], (q_n, v)).copy()  # [Q, V]
    state[:, ~np.array(usable)] = -1
    for k in range(longest):
        sym = symbols[:, k]  # [V]
        going = (state >= 0) & (sym >= 0)[None]
        state = np.where(going, table[state.clip(0), sym.clip(0)[None].repeat(q_n, 0)], state)
    dfa = TokenDFA(torch.from_numpy(state), torch.from_numpy(accepting))
    return dfa.finish(pad_id)
