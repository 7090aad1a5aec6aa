"""SELFIES (Krenn et al. 2020): every string of SELFIES symbols decodes to a valid molecule, so a sampler cannot
produce an invalid one; the price is a longer, less readable string. A family's data stays SMILES (one a line):
each is encoded to SELFIES and split into its symbols (``[C]``, ``[=O]``, ``[Branch1]``, ...); a finished sample
decodes back to SMILES, so the metrics, RDKit's answer fields and clients see SMILES. Needs PyPI ``selfies``
(the ``chem`` extra).

Prompts and templates (with [MASK]) are written in SELFIES symbols; a partial sequence (still masked) reads as
its SELFIES symbols, since it is not a molecule yet.
"""

from .symbols import MASK, SymbolTokenizer

__all__ = ["SelfiesTokenizer"]


def _sf():
    import selfies

    return selfies


class SelfiesTokenizer(SymbolTokenizer):
    kind = "selfies"

    @staticmethod
    def split(text: str) -> list[str]:
        """A SMILES string's SELFIES symbols (raises ValueError when the SMILES cannot be encoded)."""
        sf = _sf()
        try:
            return list(sf.split_selfies(sf.encoder(text, strict=True)))
        except sf.EncoderError as e:
            raise ValueError(f"not encodable as SELFIES: {text!r} ({str(e).splitlines()[0]})") from None

    def tokenize(self, text: str, allow_mask: bool = False) -> list[int]:
        """A SMILES string's symbols; with ``allow_mask``, a SELFIES template ([MASK] and [PAD] placeholders
        between SELFIES symbols)."""
        if not allow_mask:
            return super().tokenize(text)
        ids = []
        for t in _sf().split_selfies(text):
            if t not in self.index:
                raise ValueError(f"token {t!r} is not in the vocabulary; known: {' '.join(self.vocab[1:-1])}")
            ids.append(self.index[t])
        return ids

    def decode(self, ids) -> str:
        """A finished sequence's SMILES ([PAD] dropped); a sequence still masked, its SELFIES symbols."""
        symbols = "".join(self.vocab[i] for i in ids if i != self.pad_id)
        if MASK in symbols:
            return symbols
        return _sf().decoder(symbols) if symbols else ""
