"""What every tokenizer answers (``Tokenizer``): the service, the samplers and the recipes ask it, never
``hasattr`` or ``getattr``. Ids are fixed-length; [MASK] is the last id and input-only."""

from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    kind: str  # the ``type`` written to tokenizer.json (``load_tokenizer`` reads it back)
    any_text: bool  # reads any text (unknown pieces: its unk token), not only its own symbols
    pads: bool  # a sequence shorter than the length ends in padding the model generates as tokens
    length: int  # l, the model's sequence length
    pad_id: int
    mask_id: int  # = vocab_size: the input embedding's extra row
    end_id: int | None  # where a sequence ends early (text's end-of-text: a stopping kind draws nothing after
    # the block holding it); None: sequences run to the length

    @property
    def vocab_size(self) -> int: ...  # v, the output vocabulary (every id but [MASK])

    def tokenize(self, text: str, allow_mask: bool = False) -> list[int]: ...  # not padded; a template's [MASK]s

    def encode(self, text: str) -> list[int]: ...  # ``length`` ids, padded

    def decode(self, ids) -> str: ...  # [MASK] shown as "[MASK]", padding dropped

    def pieces(self, ids) -> list[str]: ...  # each position's text

    def to_dict(self) -> dict: ...

    def save(self, directory: str | Path) -> None: ...
