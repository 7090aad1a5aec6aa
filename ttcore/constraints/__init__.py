"""Constraints on what a generation may produce, as deterministic automata over a model's tokens (``TokenDFA``):
a regular expression the decoded text must match (``regex_dfa``) or a molecule grammar (``smiles_dfa``). A
constrained step draws from the model's joint restricted to the automaton's language, exactly
(``ttcore.distributions.automaton``)."""

from .dfa import MAX_STATES, ConstraintError, TokenDFA
from .regex import regex_dfa
from .smiles import smiles_dfa

__all__ = ["MAX_STATES", "ConstraintError", "TokenDFA", "regex_dfa", "smiles_dfa"]
