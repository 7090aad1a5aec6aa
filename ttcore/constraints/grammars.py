"""Grammars by name (``GRAMMARS``): what a request's ``grammar`` (or a recipe) may name, each a builder of a
``TokenDFA`` over a tokenizer's pieces and the tokenizer kinds it reads. Register a new one with
``register_grammar``; the service offers a checkpoint the grammars of its tokenizer's kind (``grammars_for``)."""

from dataclasses import dataclass
from typing import Callable

from ttcore.registry import Registry

from .smiles import smiles_dfa


@dataclass(frozen=True)
class Grammar:
    """``build(pieces, pad_id) -> TokenDFA`` over a tokenizer's pieces; ``kinds``: the tokenizer kinds it reads."""
    build: Callable
    kinds: tuple[str, ...]


GRAMMARS: Registry = Registry("grammar")  # what a request's ``grammar`` (or a recipe) may name


def register_grammar(name: str, grammar: Grammar) -> Grammar:
    return GRAMMARS.register(grammar, name)


unregister_grammar = GRAMMARS.unregister


def grammars_for(kind: str) -> tuple[str, ...]:
    """The grammars that read tokenizers of ``kind``."""
    return tuple(name for name, g in GRAMMARS.items() if kind in g.kinds)


register_grammar("smiles", Grammar(smiles_dfa, ("smiles",)))
