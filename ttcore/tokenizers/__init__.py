"""Tokenizers: each maps text to fixed-length ids with [PAD] = 0 and [MASK] = the last id."""

import json
from pathlib import Path

from .base import Tokenizer
from .smiles import SmilesTokenizer, smiles_tokens
from .symbols import CharTokenizer

_KINDS = {SmilesTokenizer.kind: SmilesTokenizer, CharTokenizer.kind: CharTokenizer}


def _text_tokenizer():  # the `tokenizers` library is an extra: imported only when a text tokenizer is used
    from .text import TextTokenizer
    return TextTokenizer


def _hf_tokenizer():  # `transformers` is an extra: imported only for a pretrained masked LM's tokenizer
    from .hf import HFTokenizer
    return HFTokenizer


def _selfies_tokenizer():  # PyPI `selfies` (the chem extra): imported only for a SELFIES family
    from .selfies import SelfiesTokenizer
    return SelfiesTokenizer


def _safe_tokenizer():  # PyPI `safe-mol` (the safe extra): imported only for a SAFE family
    from .safe import SafeTokenizer
    return SafeTokenizer


_EXTRAS = {"text": _text_tokenizer, "hf": _hf_tokenizer, "selfies": _selfies_tokenizer, "safe": _safe_tokenizer}


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer saved in a checkpoint directory (``tokenizer.json``)."""
    d = json.loads(Path(directory, "tokenizer.json").read_text())
    kind = d.get("type")
    if kind in _EXTRAS:
        return _EXTRAS[kind]().from_dict(d)
    if kind not in _KINDS:
        raise ValueError(f"unknown tokenizer type {kind!r}; known: {sorted(_KINDS) + sorted(_EXTRAS)}")
    return _KINDS[kind].from_dict(d)


__all__ = ["CharTokenizer", "SmilesTokenizer", "Tokenizer", "load_tokenizer", "smiles_tokens"]
