"""SAFE (Noutahi et al. 2024, GenMol's representation): a molecule as its BRICS fragments written as one SMILES
string, fragments separated by dots and joined through ring-closure digits (itself a valid SMILES; a molecule
with no bond BRICS cuts is one fragment, its own SMILES). A family's
data stays SMILES (one a line): each is encoded to SAFE and split into SMILES tokens; a finished sample decodes
back to canonical SMILES (a string SAFE cannot decode is kept as it is, and the metrics count it invalid), so the
metrics, RDKit's answer fields and clients see SMILES. Needs PyPI ``safe-mol`` (the ``safe`` extra).

Prompts and templates (with [MASK]) are written in SAFE; a partial sequence reads as its SAFE tokens.
"""

from .smiles import smiles_tokens
from .symbols import MASK, SymbolTokenizer

__all__ = ["SafeTokenizer"]


def _safe():
    import safe

    return safe


class SafeTokenizer(SymbolTokenizer):
    kind = "safe"

    @staticmethod
    def split(text: str) -> list[str]:
        """A SMILES string's SAFE string, as SMILES tokens (raises ValueError when SAFE cannot encode it)."""
        safe = _safe()
        try:
            encoded = safe.encode(text)
        except safe.SAFEFragmentationError:  # no bond BRICS cuts: the molecule is one fragment, its SMILES
            encoded = text
        except Exception as e:  # noqa: BLE001 - safe raises its own and RDKit's errors: all mean "not encodable"
            raise ValueError(f"not encodable as SAFE: {text!r} ({type(e).__name__})") from None
        return smiles_tokens(encoded)

    def tokenize(self, text: str, allow_mask: bool = False) -> list[int]:
        """A SMILES string's tokens; with ``allow_mask``, a SAFE template read as SMILES tokens and placeholders."""
        if not allow_mask:
            return super().tokenize(text)
        return SymbolTokenizer.tokenize(_AsWritten(self), text, allow_mask=True)

    def decode(self, ids) -> str:
        """A finished sequence's canonical SMILES ([PAD] dropped); a sequence still masked, its SAFE tokens."""
        text = "".join(self.vocab[i] for i in ids if i != self.pad_id)
        if MASK in text or not text:
            return text
        try:
            decoded = _safe().decode(text, canonical=True, ignore_errors=True)
        except Exception:  # noqa: BLE001 - an undecodable sample is an invalid one, not an error
            decoded = None
        return decoded or text


class _AsWritten:
    """``SafeTokenizer``'s vocabulary with SMILES splitting: a template is already SAFE, not SMILES to encode."""

    split = staticmethod(smiles_tokens)

    def __init__(self, tok: SafeTokenizer):
        self.index, self.vocab, self.mask_id, self.pad_id = tok.index, tok.vocab, tok.mask_id, tok.pad_id
