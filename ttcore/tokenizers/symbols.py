"""Fixed-length tokenizers over a small symbol vocabulary built from the data, with [PAD] and [MASK].

Ids: 0 = [PAD] (a real, generated token: a sequence shorter than l is followed by padding, as MDLM and
UDLM do for QM9), 1..v-1 the symbols, v = [MASK] (input only: the model never predicts it, SUBS).
A subclass says how a string splits into symbols (``split``) and names its ``kind``.
"""

import json
import re
from pathlib import Path

PAD, MASK = "[PAD]", "[MASK]"
_SPECIAL = re.compile(r"(\[MASK\]|\[PAD\])")


def decode_runs(ids, mask_id: int, skip: set[int], text_of) -> str:
    """A sequence's text from its runs of ordinary tokens (``text_of(run)``), [MASK] where masked, the ``skip`` ids
    (separators, padding, special tokens) dropped: what the subword tokenizers' ``decode`` shares."""
    out, run = [], []
    for i in ids:
        if i == mask_id or i in skip:
            if run:
                out.append(text_of(run))
                run = []
            if i == mask_id:
                out.append(MASK)
        else:
            run.append(i)
    if run:
        out.append(text_of(run))
    return "".join(out)


class SymbolTokenizer:
    kind = ""
    any_text = False  # only its own symbols: a family's data must be of its kind
    pads = True  # a sequence shorter than the length ends in [PAD]s, which the model generates as tokens
    end_id = None  # runs to the length: its end is the padding, drawn as tokens (``Tokenizer.end_id``)

    @staticmethod
    def split(text: str) -> list[str]:
        raise NotImplementedError

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
    def build(cls, sequences: list[str], length: int | None = None):
        """Vocabulary and l from a training set: l = the longest tokenized sequence unless given."""
        toks = [cls.split(s) for s in sequences]
        symbols = sorted({t for ts in toks for t in ts})
        return cls(symbols, length or max(len(t) for t in toks))

    def tokenize(self, text: str, allow_mask: bool = False) -> list[int]:
        """Token ids of one string, not padded. ``allow_mask`` reads a template (prompts): [MASK] placeholders
        to fill, and [PAD] to fix a position as end padding (the sequence ends before it)."""
        pieces = _SPECIAL.split(text) if allow_mask else [text]
        ids = []
        for piece in pieces:
            if allow_mask and piece in (MASK, PAD):
                ids.append(self.mask_id if piece == MASK else self.pad_id)
                continue
            for t in self.split(piece) if piece else []:
                if t not in self.index or t in (PAD, MASK):
                    raise ValueError(f"token {t!r} is not in the vocabulary; known: {' '.join(self.vocab[1:-1])}")
                ids.append(self.index[t])
        return ids

    def encode(self, text: str) -> list[int]:
        """Fixed-length ids, padded with [PAD]; too long raises."""
        ids = self.tokenize(text)
        if len(ids) > self.length:
            raise ValueError(f"{text!r} has {len(ids)} tokens, more than the model length {self.length}")
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
    def from_dict(cls, d: dict):
        if d.get("type") != cls.kind:
            raise ValueError(f"tokenizer type must be {cls.kind!r}, got {d.get('type')!r}")
        return cls(list(d["symbols"]), int(d["length"]))

    def save(self, directory: str | Path) -> None:
        Path(directory, "tokenizer.json").write_text(json.dumps(self.to_dict(), indent=1))


class CharTokenizer(SymbolTokenizer):
    """One symbol per character (peptides, DNA, any alphabet); the vocabulary is the data's characters."""

    kind = "char"

    @staticmethod
    def split(text: str) -> list[str]:
        return list(text)
