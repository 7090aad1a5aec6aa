"""A pretrained masked LM's own tokenizer (``transformers``), in ttcore's id layout.

ttcore's models take [MASK] as the last input id and never output it (SUBS, MDLM's layout). A masked LM's
vocabulary has its mask token anywhere (BERT 103, ESM 32, ModernBERT 50284), so ids are renumbered once:
ttcore id i is the model's id ``hf_ids[i]``, where ``hf_ids`` lists every id but the mask token's, then the mask
token's. ``ttcore.models.hf`` maps inputs and the output head the same way.

A sequence is the model's start token (``[CLS]`` / ``<cls>``, when it has one), its tokens, then padding (the
pad token ends it, as in ttcore's other padded families). The tokenizer's own files travel inside ttcore's
``tokenizer.json`` (base64), so a checkpoint needs no hub and no separate tokenizer directory.
"""

import base64
import tempfile
from pathlib import Path

from .symbols import MASK, decode_runs  # MASK: the same placeholder as every tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model")


def _spaces_are_added(hf, special: set[int]) -> bool:
    """Whether the tokenizer's decoder puts spaces between tokens that the text did not have (ESM's character
    tokenizer: "MK" decodes as "M K"): two ordinary tokens whose concatenated text encodes back to the two of them
    and decodes with a space between. Such a tokenizer's text is its tokens' texts concatenated."""
    singles = []
    for i in range(len(hf)):
        text = hf.decode([i]) if i not in special else ""
        if text and not text.isspace() and " " not in text:
            singles.append((i, text))
        if len(singles) == 8:
            break
    for (a, ta), (b, tb) in zip(singles, singles[1:]):
        if hf.encode(ta + tb, add_special_tokens=False) == [a, b]:
            return hf.decode([a, b], clean_up_tokenization_spaces=False) == f"{ta} {tb}"
    return False


def _load(files: dict[str, bytes]):
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        for name, data in files.items():
            Path(d, name).write_bytes(data)
        return AutoTokenizer.from_pretrained(d, local_files_only=True, trust_remote_code=False)


class HFTokenizer:
    kind = "hf"
    any_text = True  # a pretrained model's tokenizer reads any family's text (unknown pieces: its unk token)
    pads = True  # one sequence a row, padded: the padding is part of what the model learns (as SMILES)
    end_id = None  # as SMILES: the padding is drawn as tokens

    def __init__(self, files: dict[str, bytes], length: int, name: str, n_ids: int | None = None):
        """``n_ids``: the model's embedding rows (default: the tokenizer's size; a model may have more rows than
        tokens: those ids are in the vocabulary and decode to nothing)."""
        self.files, self.length, self.name = files, length, name
        self.hf = hf = _load(files)
        if hf.mask_token_id is None:
            raise ValueError(f"{name}'s tokenizer has no mask token: it is not a masked LM's")
        if hf.pad_token_id is None:
            raise ValueError(f"{name}'s tokenizer has no pad token: a masked LM's sequences need one")
        self.n_ids = n = max(n_ids or 0, len(hf))
        self.hf_ids = [i for i in range(n) if i != hf.mask_token_id] + [hf.mask_token_id]
        self.tt_of = {h: t for t, h in enumerate(self.hf_ids)}
        self.mask_id = n - 1
        self.pad_id = self.tt_of[hf.pad_token_id]
        start = hf.cls_token_id if hf.cls_token_id is not None else hf.bos_token_id
        self.start_id = None if start is None else self.tt_of[start]
        special = {i for i in hf.all_special_ids if i != hf.mask_token_id} | set(range(len(hf), n))
        self._skip = {self.tt_of[i] for i in special}
        self._concatenate = _spaces_are_added(hf, special)

    def _text(self, ids: list[int]) -> str:
        """The text of ttcore ids holding no special token."""
        hf_ids = self.to_hf(ids)
        if self._concatenate:
            return "".join(self.hf.decode([i], clean_up_tokenization_spaces=False) for i in hf_ids)
        return self.hf.decode(hf_ids, clean_up_tokenization_spaces=False)

    @classmethod
    def from_pretrained(cls, directory: str | Path, length: int, n_ids: int | None = None) -> "HFTokenizer":
        """The tokenizer of a local masked-LM directory (its files read as they are; no hub)."""
        d = Path(directory)
        files = {name: (d / name).read_bytes() for name in TOKENIZER_FILES if (d / name).is_file()}
        if not files:
            raise FileNotFoundError(f"{d} has no tokenizer files ({', '.join(TOKENIZER_FILES[:5])}, ...)")
        return cls(files, length, d.name, n_ids)

    @property
    def vocab_size(self) -> int:
        """Output vocabulary v (every token but the mask); [MASK] = v is input-only."""
        return self.mask_id

    def tokenize(self, text: str, allow_mask: bool = False) -> list[int]:
        """The start token, then the text's tokens (``[MASK]`` placeholders kept where ``allow_mask``)."""
        pieces = text.split(MASK) if allow_mask else [text]
        ids = [] if self.start_id is None else [self.start_id]
        for k, piece in enumerate(pieces):
            if k:
                ids.append(self.mask_id)
            if piece:
                ids += [self.tt_of[i] for i in self.hf.encode(piece, add_special_tokens=False)]
        return ids

    def encode(self, text: str) -> list[int]:
        ids = self.tokenize(text)[: self.length]
        return ids + [self.pad_id] * (self.length - len(ids))

    def to_hf(self, ids) -> list[int]:
        return [self.hf_ids[i] for i in ids]

    def decode(self, ids) -> str:
        """Masks shown as [MASK]; the start token and padding (every special token but the mask) dropped."""
        return decode_runs(ids, self.mask_id, self._skip, self._text)

    def pieces(self, ids) -> list[str]:
        """Each position's token as text (special tokens as "", [MASK] as "[MASK]")."""
        return [MASK if i == self.mask_id else "" if i in self._skip else
                self.hf.decode([self.hf_ids[i]], clean_up_tokenization_spaces=False) for i in ids]

    def to_dict(self) -> dict:
        return {"type": self.kind, "name": self.name, "length": self.length, "n_ids": self.n_ids,
                "files": {name: base64.b64encode(data).decode("ascii") for name, data in self.files.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "HFTokenizer":
        if d.get("type") != cls.kind:
            raise ValueError(f"tokenizer type must be {cls.kind!r}, got {d.get('type')!r}")
        files = {name: base64.b64decode(data) for name, data in d["files"].items()}
        return cls(files, int(d["length"]), d.get("name", "hf"), d.get("n_ids"))

    def save(self, directory: str | Path) -> None:
        import json

        Path(directory, "tokenizer.json").write_text(json.dumps(self.to_dict()))
