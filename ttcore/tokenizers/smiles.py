"""Atom-level SMILES tokenizer with [PAD] and [MASK], fixed length (ids as in ``symbols``)."""

import re

from .symbols import MASK, PAD, SymbolTokenizer

__all__ = ["MASK", "PAD", "SmilesTokenizer", "smiles_tokens"]

# Bracket atoms, two-letter halogens, aromatic atoms, ring closures (%nn too), bonds, branches.
_PATTERN = re.compile(r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|/|:|~|@|\?|>|\*|\$"
                      r"|%[0-9]{2}|[0-9])")


def smiles_tokens(smiles: str) -> list[str]:
    """Split a SMILES string into atom-level tokens; raise if some characters form no token."""
    tokens = _PATTERN.findall(smiles)
    if "".join(tokens) != smiles:
        raise ValueError(f"not a tokenizable SMILES string: {smiles!r}")
    return tokens


class SmilesTokenizer(SymbolTokenizer):
    kind = "smiles"
    split = staticmethod(smiles_tokens)
