"""A deterministic automaton over a model's output tokens (``TokenDFA``): what a constrained step multiplies its
joint by (``ttcore.distributions.automaton``). Built from a regular expression (``regex``) or a grammar
(``smiles``); every builder ends in ``TokenDFA.finish``: the model's end padding appended, states that cannot
reach acceptance removed, the size bound checked.

Tokens that move every state alike form a class, and an automaton is kept over its classes: ``moves`` [Q, C] and
each token's class [V], never the [Q, V] table (``[a-z ]{0,500}`` over the text model's 8,192 tokens: 502 states,
19 classes, 28 KB instead of 33 MB), each in the smallest integer type that holds its values. Everything here
(trimming, a prefix, satisfiability) runs over the classes: O(Q C) a position, not O(Q V)."""

import contextlib
from dataclasses import dataclass, field

import torch

KEPT_TEMPLATES = 16  # templates whose satisfiability an automaton keeps (``TokenDFA.admits``)
MAX_STATES = 512  # states a constraint may keep after trimming (the constrained step's work grows with them)


class ConstraintError(ValueError):
    """A constraint that cannot be used: empty, too large, or not satisfiable by any sequence asked for."""


def smallest_int(max_value: int) -> torch.dtype:
    """The smallest signed integer type that holds -1 .. ``max_value``."""
    for dtype in (torch.int8, torch.int16, torch.int32):
        if max_value <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def canonical_classes(moves: torch.Tensor, token_class: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Classes renumbered so that no class is empty and no two have the same column of ``moves`` [Q, C]:
    -> (moves [Q, C'] long, token_class [V] long), C' <= C."""
    used, token_class = torch.unique(token_class.long(), return_inverse=True)  # drop classes no token is in
    columns, merge = torch.unique(moves.long()[:, used].T, dim=0, return_inverse=True)  # equal columns: one class
    return columns.T.contiguous(), merge[token_class]


@dataclass(frozen=True, eq=False)
class TokenDFA:
    """``moves`` [Q, C]: the state after a token of each class (-1: rejected), start state 0; ``token_class`` [V]:
    each token's class (every class non-empty, no two alike: ``canonical_classes``); ``accepting`` [Q] bool. Build
    it from a [Q, V] table with ``TokenDFA.of_tokens``."""
    moves: torch.Tensor
    token_class: torch.Tensor
    accepting: torch.Tensor
    _fits: dict = field(default_factory=dict, repr=False)  # template -> ``admits`` (the last few asked)

    @classmethod
    def over_classes(cls, moves: torch.Tensor, token_class: torch.Tensor, accepting: torch.Tensor) -> "TokenDFA":
        """Classes made canonical, stored compactly (moves in ``smallest_int(Q)``, classes in ``smallest_int(C)``)."""
        moves, token_class = canonical_classes(moves, token_class)
        return cls(moves.to(smallest_int(moves.shape[0])), token_class.to(smallest_int(moves.shape[1])),
                   accepting.bool())

    @classmethod
    def of_tokens(cls, delta: torch.Tensor, accepting: torch.Tensor) -> "TokenDFA":
        """From ``delta`` [Q, V], the state after each token (-1: rejected)."""
        return cls.over_classes(delta, torch.arange(delta.shape[1]), accepting)

    @property
    def num_states(self) -> int:
        return self.moves.shape[0]

    @property
    def num_classes(self) -> int:
        return self.moves.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.token_class.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes the automaton holds (what a cache of automata counts)."""
        return sum(t.element_size() * t.numel() for t in (self.moves, self.token_class, self.accepting))

    @property
    def classes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(token_class [V] long, moves [Q, C] long): a constrained step's messages run over the classes
        (``ttcore.distributions.automaton``)."""
        return self.token_class.long(), self.moves.long()

    @property
    def delta(self) -> torch.Tensor:
        """The [Q, V] table, state after each token (long): for small automata and tests; Q V entries."""
        return self.moves.long()[:, self.token_class.long()]

    def step(self, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The states after reading ``tokens`` from states ``q`` (same shape; -1 in or out: rejected)."""
        nxt = self.moves.long()[q.clamp_min(0), self.token_class.long()[tokens]]
        return torch.where(q >= 0, nxt, q)

    def run(self, ids) -> int:
        """The state after reading ``ids`` from the start (-1: rejected on the way)."""
        q = torch.zeros(1, dtype=torch.long)
        for i in ids:
            q = self.step(q, torch.tensor([int(i)]))
        return int(q)

    def accepts(self, ids) -> bool:
        q = self.run(ids)
        return q >= 0 and bool(self.accepting[q])

    def accepts_all(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each row of ``ids`` [n, l] is accepted, all rows at once. -> [n] bool."""
        q = torch.zeros(ids.shape[0], dtype=torch.long)
        for i in range(ids.shape[1]):
            q = self.step(q, ids[:, i])
        return (q >= 0) & self.accepting[q.clamp_min(0)]

    def padded(self, pad_id: int) -> "TokenDFA":
        """The language followed by any number of ``pad_id`` (a model's end padding): a new accepting state that
        reads only padding, entered by padding from every accepting state; padding is rejected elsewhere."""
        q, c = self.moves.shape
        moves = torch.cat([self.moves.long(), torch.full((1, c), -1, dtype=torch.long)])  # the new state's row
        pad_column = torch.where(torch.cat([self.accepting, torch.tensor([True])]), q, -1)
        token_class = self.token_class.long().clone()
        token_class[pad_id] = c  # padding in a class of its own
        return TokenDFA.over_classes(torch.cat([moves, pad_column[:, None]], 1), token_class,
                                     torch.cat([self.accepting, torch.tensor([True])]))

    def with_prefix(self, ids) -> "TokenDFA":
        """``ids`` exactly, then the language: len(ids) new states read the prefix, the old start follows."""
        n, c = len(ids), self.num_classes
        distinct = sorted(set(int(i) for i in ids))
        token_class = self.token_class.long().clone()
        own = torch.arange(c, c + len(distinct))  # each prefix token in a class of its own, moving as before
        token_class[distinct] = own
        old = self.moves.long()
        moves = torch.cat([old, old[:, self.token_class.long()[distinct]]], 1)  # [Q, C + d]
        moves = torch.where(moves >= 0, moves + n, moves)
        chain = torch.full((n, moves.shape[1]), -1, dtype=torch.long)
        chain[torch.arange(n), token_class[torch.tensor(ids, dtype=torch.long)]] = torch.arange(1, n + 1)
        return TokenDFA.over_classes(torch.cat([chain, moves]), token_class,
                                     torch.cat([torch.zeros(n, dtype=torch.bool), self.accepting]))

    def trimmed(self) -> "TokenDFA":
        """Only the states reachable from the start that can still reach acceptance (the others are rejection in
        disguise), renumbered with the start first. Raises ``ConstraintError`` for an empty language."""
        moves, q_n = self.moves.long(), self.num_states
        reach = torch.zeros(q_n, dtype=torch.bool)
        reach[0] = True
        while True:
            nxt = moves[reach].flatten()
            new = reach.clone()
            new[nxt[nxt >= 0]] = True
            if torch.equal(new, reach):
                break
            reach = new
        live = self.accepting.clone()
        while True:
            new = live | torch.where(moves >= 0, live[moves.clamp_min(0)], False).any(1)
            if torch.equal(new, live):
                break
            live = new
        keep = reach & live
        if not keep[0]:
            raise ConstraintError("the language is empty: no sequence of tokens is accepted")
        index = torch.full((q_n + 1,), -1, dtype=torch.long)  # old state (or -1 at the end) -> new
        index[keep.nonzero()[:, 0]] = torch.arange(int(keep.sum()))
        kept = moves[keep]
        return TokenDFA.over_classes(index[torch.where(kept >= 0, kept, q_n)], self.token_class, self.accepting[keep])

    def finish(self, pad_id: int | None, max_states: int = MAX_STATES) -> "TokenDFA":
        """Padding appended (``pad_id``; None: the model never pads), trimmed, at most ``max_states`` states."""
        dfa = (self.padded(pad_id) if pad_id is not None else self).trimmed()
        if dfa.num_states > max_states:
            raise ConstraintError(f"the constraint needs {dfa.num_states} automaton states over the model's tokens, "
                                  f"more than the limit of {max_states}")
        return dfa

    def satisfiable(self, template: torch.Tensor) -> torch.Tensor:
        """Whether some accepted sequence agrees with each row of ``template`` [n, l] (token ids; -1 free).
        -> [n] bool. Any sequence agreeing with it has positive probability under a model (softmax outputs),
        so this is exactly whether a constrained generation from the template exists. Boolean reachability
        over the classes: a free position moves the reachable states by the automaton's [Q, Q] adjacency, a
        known token by its class's column; O(l n Q^2) at most."""
        n, l = template.shape
        moves, q_n = self.moves.long(), self.num_states
        adjacency = torch.zeros(q_n, q_n + 1)  # [Q, Q + 1]: whether some token leads q to q' (column Q: rejected)
        adjacency[torch.arange(q_n)[:, None].expand_as(moves), torch.where(moves >= 0, moves, q_n)] = 1
        adjacency = adjacency[:, :q_n]
        reach = torch.zeros(n, q_n)
        reach[:, 0] = 1
        for i in range(l):
            t = template[:, i]
            free = (reach @ adjacency).clamp_max(1)  # [n, Q]
            nxt = moves[:, self.token_class.long()[t.clamp_min(0)]].T  # [n, Q]: each row's token from each state
            known = torch.zeros(n, q_n + 1).scatter_add_(1, torch.where(nxt >= 0, nxt, q_n), reach)[:, :q_n]
            reach = torch.where((t < 0)[:, None], free, known.clamp_max(1))
        return (reach * self.accepting).sum(1) > 0

    def admits(self, template: torch.Tensor) -> bool:
        """``satisfiable`` of one template [l] (token ids; -1 free), kept with the automaton (the last
        ``KEPT_TEMPLATES`` asked): a server asks it at admission, its run again when it starts."""
        key = tuple(template.tolist())
        known = self._fits.get(key)
        if known is None:
            known = bool(self.satisfiable(template[None].cpu()).item())
            if len(self._fits) >= KEPT_TEMPLATES:  # the oldest goes (threads may race here: a miss is harmless)
                with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                    self._fits.pop(next(iter(self._fits)))
            self._fits[key] = known
        return known

    def fits(self, length: int) -> bool:
        """Whether some accepted sequence has exactly ``length`` tokens (``admits`` of an all-free template)."""
        return self.admits(torch.full((length,), -1))
