"""A regular expression as an automaton over a model's tokens, standalone: no torch, so a child process builds
it in a fraction of a second (``ttcore.constraints.regex.bounded_token_automaton`` runs ``python -m
ttcore.regex_fsm`` with the request on stdin, killed past its time and memory limits). Two parts, both bounded
by that child: interegular's reduced character FSM (``char_automaton``), then every token's walk through it
(``token_walk``), kept over token classes (tokens that move every state alike).

    echo '{"pattern": "[0-9]{4}", "pieces": ["[PAD]", "1", "12"], "pad": 0}' | python -m ttcore.regex_fsm
"""

import json
import sys

MAX_CHAR_STATES = 2048  # character-automaton states a pattern may have (its token automaton is smaller or equal)


class PatternError(ValueError):
    """A pattern that cannot be used (unreadable, or its automaton too large)."""


def char_automaton(pattern: str, max_states: int = MAX_CHAR_STATES) -> dict:
    """interegular's reduced FSM of ``pattern``: ``table`` [Q][S] (the next state, -1 where it rejects; the
    initial state is row 0), ``chars`` (each character of the pattern's alphabet -> its column), ``other`` (the
    column of every other character), ``accepting`` [Q]. Raises ``PatternError``. Unbounded in time and memory (a
    counted repetition inside another, or a subset construction that explodes, takes minutes): strangers' patterns
    go through a child process (module docstring)."""
    import interegular

    try:
        fsm = interegular.parse_pattern(pattern).to_fsm().reduce()
        if len(fsm.states) > max_states:
            raise PatternError(f"the pattern's automaton has {len(fsm.states)} states, more than {max_states}")
        states = sorted(fsm.states, key=lambda s: (s != fsm.initial, s))  # the initial state first
        row = {s: i for i, s in enumerate(states)}
        col = {s: j for j, s in enumerate(sorted(set(fsm.alphabet.values())))}
        table = [[-1] * len(col) for _ in states]
        for s, moves in fsm.map.items():
            for sym, nxt in moves.items():
                table[row[s]][col[sym]] = row[nxt]
        other = col.get(fsm.alphabet[interegular.fsm.anything_else]) if col else None
        return {"table": table, "chars": {ch: col[sym] for ch, sym in fsm.alphabet.items() if isinstance(ch, str)},
                "other": other, "accepting": [s in fsm.finals for s in states]}
    except PatternError:
        raise
    except Exception as e:  # noqa: BLE001 (its parser and FSM code raise several kinds): the caller answers 422
        raise PatternError(f"not a regular expression this server reads: {type(e).__name__}: {e}") from None


def live_states(table, accepting) -> int:
    """The states of a character automaton (``table`` [Q, S] int array, -1 rejected) that can reach acceptance."""
    import numpy as np

    live = np.asarray(accepting, dtype=bool)
    while True:
        new = live | np.where(table >= 0, live[table.clip(0)], False).any(1)
        if (new == live).all():
            return int(live.sum())
        live = new


def token_walk(fsm: dict, pieces: list[str], pad_id: int | None, max_states: int | None = None) -> dict:
    """Every token's walk through the character automaton ``fsm`` from every state at once: -> ``moves``
    [Q][C] (the state after a token of each class, -1: rejected), ``token_class`` [V], ``accepting`` [Q], and
    ``missing``: the pattern's characters that no usable token writes. A token whose text is not whole
    characters (a byte-level piece of one), is empty, or is the padding is never allowed (its own class).
    O(Q x the tokens' characters): each character position k walks only the tokens longer than k. When every
    symbol of the pattern's alphabet is a token of one character, the token automaton has exactly the
    character automaton's live states (plus the padding's): more than ``max_states`` is refused before the walk."""
    import numpy as np

    table = np.asarray(fsm["table"], dtype=np.int32).reshape(len(fsm["accepting"]), -1)
    chars, other = fsm["chars"], fsm["other"]
    (q_n, s_n), v = table.shape, len(pieces)
    usable = np.array([i != pad_id and p != "" and "\ufffd" not in p for i, p in enumerate(pieces)], dtype=bool)
    symbols = [[chars.get(ch, other) for ch in p] if ok else [] for p, ok in zip(pieces, usable)]
    usable &= np.array([all(s is not None for s in sym) for sym in symbols], dtype=bool)  # no column: rejected
    lengths = np.array([len(s) if ok else 0 for s, ok in zip(symbols, usable)])
    singles = {symbols[i][0] for i in np.nonzero(lengths == 1)[0]}
    if max_states is not None and singles >= set(range(s_n)):
        states = live_states(table, fsm["accepting"]) + (pad_id is not None)
        if states > max_states:
            raise PatternError(f"the constraint needs {states} automaton states over the model's tokens, more than "
                               f"the limit of {max_states}")
    flat = table.ravel()
    state = np.broadcast_to(np.arange(q_n, dtype=np.int32)[None], (v, q_n)).copy()  # [V, Q]
    state[~usable] = -1
    for k in range(int(lengths.max(initial=0))):
        tokens = np.nonzero(lengths > k)[0]
        sym = np.array([symbols[i][k] for i in tokens], dtype=np.int32)
        at = state[tokens]  # [n_k, Q]
        state[tokens] = np.where(at >= 0, flat[at.clip(0) * s_n + sym[:, None]], -1)
    rows = np.ascontiguousarray(state).view(np.dtype((np.void, 4 * q_n))).ravel()  # a token's row as one key
    _, first, token_class = np.unique(rows, return_index=True, return_inverse=True)
    written = set("".join(p for p, ok in zip(pieces, usable) if ok))
    return {"moves": state[first].T.tolist(), "token_class": token_class.reshape(-1).tolist(),
            "accepting": fsm["accepting"], "missing": sorted(ch for ch in chars if ch not in written)}


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    cpu = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if limit or cpu:  # the parent's limits, set before any work: address space, and CPU seconds (SIGXCPU past it)
        import resource

        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if cpu:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    try:
        ask = json.loads(sys.stdin.read())
        out = token_walk(char_automaton(ask["pattern"]), ask["pieces"], ask.get("pad"), ask.get("max_states"))
    except PatternError as e:
        out = {"error": str(e)}
    except MemoryError:
        out = {"error": f"the pattern's automaton needs more than {limit >> 20} MB to build", "memory": True}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
