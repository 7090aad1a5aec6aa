"""Tokenizers: each maps text to fixed-length ids with [PAD] = 0 and [MASK] = the last id."""

import json
from pathlib import Path

from .smiles import SmilesTokenizer, smiles_tokens
from .symbols import CharTokenizer

_KINDS = {SmilesTokenizer.kind: SmilesTokenizer, CharTokenizer.kind: CharTokenizer}


def _text_tokenizer():  # the `tokenizers` library is an extra: imported only when a text tokenizer is used
    from .text import TextTokenizer
    return TextTokenizer


def load_tokenizer(directory: str | Path):
    """The tokenizer saved in a checkpoint directory (``tokenizer.json``)."""
    d = json.loads(Path(directory, "tokenizer.json").read_text())
    if d.get("type") == "text":
        return _text_tokenizer().from_dict(d)
    if d.get("type") not in _KINDS:
        raise ValueError(f"unknown tokenizer type {d.get('type')!r}; known: {sorted(_KINDS) + ['text']}")
    return _KINDS[d["type"]].from_dict(d)


__all__ = ["CharTokenizer", "SmilesTokenizer", "load_tokenizer", "smiles_tokens"]
