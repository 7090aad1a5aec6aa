"""A SMILES grammar as a ``TokenDFA`` over an atom-level SMILES vocabulary (``ttcore.tokenizers.smiles``):
what a regular language can check of a SMILES string. A molecule is atoms joined by bonds, with branches
"(" ... ")" that are never empty and nest at most ``max_depth`` deep, and ring-closure labels (a digit or %nn)
that pair up: each label opens a ring the first time and closes it the second, at most ``max_open`` open at once,
none left open at the end; a bond symbol is followed by an atom or a ring label; "." starts another component
at depth 0. Bracket atoms ("[nH]", "[NH3+]") are single tokens of the vocabulary, so they are well formed by
construction. What it cannot see: valences, aromaticity, a ring closed on the atom that opened it, a ring
bond between atoms already bonded (``C1C1``). Within its bounds (branch depth, open labels) it accepts every
string RDKit parses that is written in the vocabulary's tokens: ``tests/constraints`` runs it over every
molecule of the QM9 and MOSES training splits and over one-token edits of QM9 molecules that RDKit parses.

A state is (phase, branch depth, the set of open ring labels); the phases: ``start`` (a component's first atom
next), ``atom`` (after an atom or a ring label), ``close`` (after ")": a ring label may follow, for the atom
before the branch), ``bond``
(after a bond symbol), ``branch`` (after "(")."""

import torch

from .dfa import TokenDFA

ORGANIC = {"B", "C", "N", "O", "P", "S", "F", "Cl", "Br", "I", "b", "c", "n", "o", "s", "p", "*"}
BONDS = {"-", "=", "#", "$", ":", "/", "\\"}
MAX_DEPTH = 5  # branch nesting: MOSES's training split reaches 5, QM9's 2
MAX_STATES = 4096  # the grammar is the server's own (not a request's): QM9's has 706 states, MOSES's 1,410


def role(piece: str) -> str | None:
    """What a token is to the grammar: atom, bond, open, close, ring, dot; None for anything else (rejected)."""
    if piece in ORGANIC or (len(piece) > 2 and piece[0] == "[" and piece[-1] == "]"):
        return "atom"
    if piece in BONDS:
        return "bond"
    if piece.isdigit() and len(piece) == 1 or (len(piece) == 3 and piece[0] == "%" and piece[1:].isdigit()):
        return "ring"
    return {"(": "open", ")": "close", ".": "dot"}.get(piece)


def _moves(state, piece_role: str, piece: str, max_depth: int, max_open: int):
    """The state after a token of this role (None: rejected)."""
    phase, depth, open_ = state
    if piece_role == "atom":
        return ("atom", depth, open_)
    if piece_role == "bond":
        return ("bond", depth, open_) if phase in ("atom", "close", "branch") else None
    if piece_role == "ring":  # after ")" too: the label is the branch's atom's (RDKit reads C(C)1CC1)
        if phase not in ("atom", "bond", "close"):
            return None
        if piece in open_:
            return ("atom", depth, open_ - {piece})
        return ("atom", depth, open_ | {piece}) if len(open_) < max_open else None
    if piece_role == "open":
        return ("branch", depth + 1, open_) if phase in ("atom", "close") and depth < max_depth else None
    if piece_role == "close":
        return ("close", depth - 1, open_) if phase in ("atom", "close") and depth > 0 else None
    if piece_role == "dot":
        return ("start", 0, open_) if phase in ("atom", "close") and depth == 0 else None
    return None


def smiles_dfa(pieces: list[str], pad_id: int | None, max_depth: int = MAX_DEPTH, max_open: int | None = None
               ) -> TokenDFA:
    """The grammar over the tokens ``pieces`` (``tokenizer.pieces``), ``pad_id`` the end padding; ``max_open``
    defaults to the number of ring labels in the vocabulary. -> a finished ``TokenDFA``."""
    roles = [None if i == pad_id else role(p) for i, p in enumerate(pieces)]
    labels = {p for p, r in zip(pieces, roles) if r == "ring"}
    max_open = len(labels) if max_open is None else max_open
    start = ("start", 0, frozenset())
    index, order, rows = {start: 0}, [start], []
    while len(rows) < len(order):
        state = order[len(rows)]
        row = []
        for piece, r in zip(pieces, roles):
            nxt = None if r is None else _moves(state, r, piece, max_depth, max_open)
            if nxt is not None and nxt not in index:
                index[nxt] = len(order)
                order.append(nxt)
            row.append(-1 if nxt is None else index[nxt])
        rows.append(row)
    accepting = torch.tensor([s[0] in ("atom", "close") and s[1] == 0 and not s[2] for s in order])
    return TokenDFA.of_tokens(torch.tensor(rows, dtype=torch.long), accepting).finish(pad_id, MAX_STATES)
