"""Atom-level SMILES tokenizer with [PAD] and [MASK], fixed length.

Ids: 0 = [PAD] (a real, generated token: a molecule shorter than l is followed by padding, as MDLM and
UDLM do for QM9), 1..v-1 the symbols, v = [MASK] (input only: the model never predicts it, SUBS).
"""

import json
import re
from pathlib import Path

PAD, MASK = "[PAD]", "[MASK]"
# Bracket atoms, two-letter halogens, aromatic atoms, ring closures (%nn too), bonds, branches.
_PATTERN = re.compile(r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|/|:|~|@|\?|>|\*|\$"
                      r"|%[0-9]{2}|[0-9])")


def smiles_tokens(smiles: str) -> list[str]:
    """Split a SMILES string into atom-level tokens; raise if some characters form no token."""
    tokens = _PATTERN.findall(smiles)
    if "".join(tokens) != smiles:
        raise ValueError(f"not a tokenizable SMILES string: {smiles!r}")
    return tokens


class SmilesTokenizer:
    kind = "smiles"

    def __init__(self, symbols: list[str], length: int):
        if PAD in symbols or MASK in symbols:
            raise ValueError("symbols must not include the special tokens [PAD] / [MASK]")
        self.vocab = [PAD] + list(symbols) + [MASK]
        self.index = {s: i for i, s in enumerate(self.vocab)}
        self.length = length
        self.pad_id, self.mask_id = 0, len(self.vocab) - 1

    @property
    def vocab_size(self) -> int:
        """Output vocabulary v (everything but [MASK]); the input embedding has v + 1 rows."""
        return len(self.vocab) - 1

    @classmethod
    def build(cls, smiles: list[str], length: int | None = None) -> "SmilesTokenizer":
        """Vocabulary and l from a training set: l = the longest tokenized SMILES unless given."""
        toks = [smiles_tokens(s) for s in smiles]
        symbols = sorted({t for ts in toks for t in ts})
        return cls(symbols, length or max(len(t) for t in toks))

    def tokenize(self, text: str, allow_mask: bool = False) -> list[int]:
        """Token ids of one string, not padded. ``allow_mask`` reads a template (prompts): [MASK] placeholders
        to fill, and [PAD] to fix a position as end padding (the molecule ends before it)."""
        pieces = re.split(r"(\[MASK\])", text) if allow_mask else [text]
        ids = []
        for piece in pieces:
            if piece == MASK:
                ids.append(self.mask_id)
                continue
            for t in smiles_tokens(piece) if piece else []:
                if t == PAD and allow_mask:
                    ids.append(self.pad_id)
                    continue
                if t not in self.index or t in (PAD, MASK):
                    raise ValueError(f"token {t!r} is not in the vocabulary; known: {' '.join(self.vocab[1:-1])}")
                ids.append(self.index[t])
        return ids

    def encode(self, smiles: str) -> list[int]:
        """Fixed-length ids, padded with [PAD]; too long raises."""
        ids = self.tokenize(smiles)
        if len(ids) > self.length:
            raise ValueError(f"{smiles!r} has {len(ids)} tokens, more than the model length {self.length}")
        return ids + [self.pad_id] * (self.length - len(ids))

    def decode(self, ids) -> str:
        """Ids -> string; [PAD] is dropped, [MASK] kept visible (partial sequences while streaming)."""
        return "".join(self.vocab[i] for i in ids if i != self.pad_id)

    def pieces(self, ids) -> list[str]:
        """Each position's token as text ([PAD] as "", [MASK] as "[MASK]"): what a position shows."""
        return ["" if i == self.pad_id else self.vocab[i] for i in ids]

    def to_dict(self) -> dict:
        return {"type": self.kind, "symbols": self.vocab[1:-1], "length": self.length}

    @classmethod
    def from_dict(cls, d: dict) -> "SmilesTokenizer":
        if d.get("type") != cls.kind:
            raise ValueError(f"tokenizer type must be {cls.kind!r}, got {d.get('type')!r}")
        return cls(list(d["symbols"]), int(d["length"]))

    def save(self, directory: str | Path) -> None:
        Path(directory, "tokenizer.json").write_text(json.dumps(self.to_dict(), indent=1))
