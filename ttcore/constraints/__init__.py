"""Constraints on what a generation may produce, as deterministic automata over a model's tokens (``TokenDFA``):
a regular expression the decoded text must match (``regex_dfa``) or a grammar by name (``GRAMMARS``: ``smiles``,
``smiles_dfa``). A
constrained step draws from the model's joint restricted to the automaton's language, exactly
(``ttcore.distributions.automaton``)."""

from .dfa import MAX_STATES, ConstraintError, TokenDFA
from .grammars import GRAMMARS, Grammar, grammars_for, register_grammar, unregister_grammar
from .regex import regex_dfa
from .smiles import smiles_dfa

__all__ = ["GRAMMARS", "MAX_STATES", "ConstraintError", "Grammar", "TokenDFA", "grammars_for", "regex_dfa",
           "register_grammar", "smiles_dfa", "unregister_grammar"]
