"""A regular expression as a character automaton (interegular's reduced FSM as plain tables), standalone: no
torch, so a child process builds it in a fraction of a second (``ttcore.constraints.regex.bounded_char_automaton``
runs ``python -m ttcore.regex_fsm`` with the pattern on stdin, killed past its time and memory limits).

    echo '[0-9]{4}' | python -m ttcore.regex_fsm      # prints the tables as JSON, or {"error": ...}
"""

import json
import sys

MAX_CHAR_STATES = 2048  # character-automaton states a pattern may have (its token automaton is smaller or equal)


class PatternError(ValueError):
    """A pattern that cannot be used (unreadable, or its automaton too large)."""


def char_automaton(pattern: str) -> dict:
    """interegular's reduced FSM of ``pattern``: ``table`` [Q][S] (the next state, -1 where it rejects; the
    initial state is row 0), ``chars`` (each character of the pattern's alphabet -> its column), ``other`` (the
    column of every other character), ``accepting`` [Q]. Raises ``PatternError``. Unbounded in time and memory (a
    counted repetition inside another, or a subset construction that explodes, takes minutes): strangers' patterns
    go through a child process (module docstring)."""
    import interegular

    try:
        fsm = interegular.parse_pattern(pattern).to_fsm().reduce()
    except Exception as e:  # noqa: BLE001 (its parser raises several kinds): the caller answers 422
        raise PatternError(f"not a regular expression this server reads: {type(e).__name__}: {e}") from None
    if len(fsm.states) > MAX_CHAR_STATES:
        raise PatternError(f"the pattern's automaton has {len(fsm.states)} states, more than {MAX_CHAR_STATES}")
    states = sorted(fsm.states, key=lambda s: (s != fsm.initial, s))  # the initial state first
    row = {s: i for i, s in enumerate(states)}
    col = {s: j for j, s in enumerate(sorted(set(fsm.alphabet.values())))}
    table = [[-1] * len(col) for _ in states]
    for s, moves in fsm.map.items():
        for sym, nxt in moves.items():
            table[row[s]][col[sym]] = row[nxt]
    return {"table": table, "chars": {ch: col[sym] for ch, sym in fsm.alphabet.items() if isinstance(ch, str)},
            "other": col[fsm.alphabet[interegular.fsm.anything_else]],
            "accepting": [s in fsm.finals for s in states]}


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if limit:  # the parent's memory limit, set before any work
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        out = char_automaton(sys.stdin.read())
    except PatternError as e:
        out = {"error": str(e)}
    except MemoryError:
        out = {"error": f"the pattern's automaton needs more than {limit >> 20} MB to build"}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
