"""A deterministic automaton over a model's output tokens (``TokenDFA``): what a constrained step multiplies its
joint by (``ttcore.distributions.automaton``). Built from a regular expression (``regex``) or a grammar
(``smiles``); every builder ends in ``TokenDFA.finish``: the model's end padding appended, states that cannot
reach acceptance removed, the size bound checked."""

from dataclasses import dataclass
from functools import cached_property

import torch

MAX_STATES = 512  # states a constraint may keep after trimming (the constrained step's work grows with them)


class ConstraintError(ValueError):
    """A constraint that cannot be used: empty, too large, or not satisfiable by any sequence asked for."""


@dataclass(frozen=True)
class TokenDFA:
    """``delta`` [Q, V] long: the state after each token (-1: rejected), start state 0; ``accepting`` [Q] bool."""
    delta: torch.Tensor
    accepting: torch.Tensor

    @property
    def num_states(self) -> int:
        return self.delta.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.delta.shape[1]

    @cached_property
    def classes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens that move every state alike, as one class: (token_class [V], the transitions over the classes
        [Q, C]). A constrained step's messages run over the classes (``ttcore.distributions.automaton``)."""
        from ttcore.distributions.automaton import token_classes

        return token_classes(self.delta)

    def run(self, ids) -> int:
        """The state after reading ``ids`` from the start (-1: rejected on the way)."""
        q = 0
        for i in ids:
            q = int(self.delta[q, int(i)])
            if q < 0:
                return -1
        return q

    def accepts(self, ids) -> bool:
        q = self.run(ids)
        return q >= 0 and bool(self.accepting[q])

    def accepts_all(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each row of ``ids`` [n, l] is accepted, all rows at once. -> [n] bool."""
        q = torch.zeros(ids.shape[0], dtype=torch.long)
        for i in range(ids.shape[1]):
            q = torch.where(q >= 0, self.delta[q.clamp_min(0), ids[:, i]], q)
        return (q >= 0) & self.accepting[q.clamp_min(0)]

    def padded(self, pad_id: int) -> "TokenDFA":
        """The language followed by any number of ``pad_id`` (a model's end padding): a new accepting state that
        reads only padding, entered by padding from every accepting state; padding is rejected elsewhere."""
        q, v = self.delta.shape
        delta = torch.cat([self.delta, torch.full((1, v), -1, dtype=torch.long)])
        delta[:, pad_id] = -1
        delta[torch.cat([self.accepting, torch.tensor([True])]), pad_id] = q
        return TokenDFA(delta, torch.cat([self.accepting, torch.tensor([True])]))

    def with_prefix(self, ids) -> "TokenDFA":
        """``ids`` exactly, then the language: len(ids) new states read the prefix, the old start follows."""
        n, v = len(ids), self.vocab_size
        chain = torch.full((n, v), -1, dtype=torch.long)
        chain[torch.arange(n), torch.tensor(ids, dtype=torch.long)] = torch.arange(1, n + 1)
        delta = torch.cat([chain, torch.where(self.delta >= 0, self.delta + n, self.delta)])
        return TokenDFA(delta, torch.cat([torch.zeros(n, dtype=torch.bool), self.accepting]))

    def trimmed(self) -> "TokenDFA":
        """Only the states reachable from the start that can still reach acceptance (the others are rejection in
        disguise), renumbered with the start first. Raises ``ConstraintError`` for an empty language."""
        q_n = self.num_states
        reach = torch.zeros(q_n, dtype=torch.bool)
        reach[0] = True
        while True:
            nxt = self.delta[reach].flatten()
            new = reach.clone()
            new[nxt[nxt >= 0]] = True
            if torch.equal(new, reach):
                break
            reach = new
        live = self.accepting.clone()
        while True:
            to_live = torch.where(self.delta >= 0, live[self.delta.clamp_min(0)], False).any(1)
            new = live | to_live
            if torch.equal(new, live):
                break
            live = new
        keep = reach & live
        if not keep[0]:
            raise ConstraintError("the language is empty: no sequence of tokens is accepted")
        index = torch.full((q_n + 1,), -1, dtype=torch.long)  # old state (or -1 at the end) -> new
        index[keep.nonzero()[:, 0]] = torch.arange(int(keep.sum()))
        old = self.delta[keep]
        delta = index[torch.where(old >= 0, old, q_n)]
        return TokenDFA(delta, self.accepting[keep])

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
        so this is exactly whether a constrained generation from the template exists."""
        n, l = template.shape
        reach = torch.zeros(n, self.num_states, dtype=torch.bool)
        reach[:, 0] = True
        can = self.delta >= 0
        for i in range(l):
            t = template[:, i]
            step = torch.zeros_like(reach)
            free = t < 0
            if free.any():  # every token: the states any token leads to
                onto = reach[free][:, :, None] & can[None]  # [f, Q, V]
                targets = torch.zeros_like(reach[free])
                rows, qs, vs = onto.nonzero(as_tuple=True)
                targets[rows, self.delta[qs, vs]] = True
                step[free] = targets
            if (~free).any():
                rows = (~free).nonzero()[:, 0]
                nxt = self.delta[:, t[rows]].T  # [k, Q]: each row's token from every state
                ok = reach[rows] & (nxt >= 0)
                r2, q2 = ok.nonzero(as_tuple=True)
                step[rows[r2], nxt[r2, q2]] = True
            reach = step
        return (reach & self.accepting[None]).any(1)
