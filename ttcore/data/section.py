"""A data family as configuration: the ``data:`` section of a recipe config.

    data:
      source: peptides.txt      # a packaged corpus (qm9, moses, text) or a file: .txt / .smi (one sequence
                                # per line), .csv (a column), any of them .gz
      column: sequence          # .csv: the column holding the sequences (default: the first)
      tokenizer: char           # smiles | selfies | safe | char | bpe | gpt2 (default: the corpus's; a file: smiles)
      length: 64                # tokens per sequence (default: the longest in the data; bpe / gpt2: 128)
      val_fraction: 0.05        # or val: a file of validation sequences
      test: held_out.txt        # optional: held-out sequences the metrics compare against
      metrics: none             # a registered kind (ttcore.metrics.kinds): molecules | text | none (default:
                                # molecules for smiles, text for bpe / gpt2)
      family: peptides          # the name the service serves it under (default: the corpus or file name)
      augment: 0                # molecules: randomized SMILES per training molecule added to the training split

A family's name, tokenizer kind and metrics travel with its checkpoints (``extra``), so the service and
``evaluate.py`` need no code for a new one.
"""

from dataclasses import dataclass, fields
from pathlib import Path

from ttcore.metrics.kinds import METRICS_KINDS, default_metrics, get_metrics_kind

from .corpora import CORPORA

TOKENIZERS = ("smiles", "selfies", "safe", "char", "bpe", "gpt2")
MOLECULE_TOKENIZERS = ("smiles", "selfies", "safe")  # SMILES data, read by each as its representation
PACKED = ("bpe", "gpt2")  # documents joined and cut into blocks of the length, as MDLM does for text


def coerce_numbers(obj, where: str = "") -> None:
    """Numbers typed as text become numbers (YAML 1.1 reads ``3e-4`` as a string); anything else that does not
    match a numeric field's type is an error naming the key."""
    for f in fields(obj):
        value, kinds = getattr(obj, f.name), getattr(f.type, "__args__", (f.type,))
        if value is None or not ({int, float} & set(kinds)) or isinstance(value, bool):
            continue
        kind = float if float in kinds else int
        try:
            number = kind(value) if isinstance(value, (str, int, float)) else None
        except ValueError:
            number = None
        if number is None or (kind is int and isinstance(value, float) and value != number):
            raise ValueError(f"{where}{f.name} must be {kind.__name__}, got {value!r}")
        setattr(obj, f.name, number)


@dataclass
class DataSection:
    source: str = "qm9"
    column: str | None = None
    tokenizer: str | None = None
    bpe_vocab: int = 8192
    length: int | None = None
    val_fraction: float = 0.05
    val: str | None = None
    test: str | None = None
    metrics: str | None = None
    family: str | None = None
    augment: int = 0  # molecules: this many randomized SMILES of each training molecule beside it (0: none)

    def __post_init__(self):
        coerce_numbers(self, "data.")
        corpus = CORPORA.get(self.source)
        if self.tokenizer is None:
            self.tokenizer = corpus.tokenizer if corpus else "smiles"
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"data.tokenizer must be one of {list(TOKENIZERS)}, got {self.tokenizer!r}")
        if self.metrics is None:
            self.metrics = default_metrics(self.tokenizer)
        if self.metrics not in METRICS_KINDS:
            raise ValueError(f"data.metrics must be one of {list(METRICS_KINDS)}, got {self.metrics!r}")
        kind = get_metrics_kind(self.metrics)
        if not kind.applies_to(self.tokenizer):
            raise ValueError(f"data.metrics: {kind.name} needs data.tokenizer: {' or '.join(kind.tokenizers)}")
        if corpus is not None and corpus.packed and not self.packed:
            raise ValueError(f"data.source: {self.source} is packed into blocks: it needs data.tokenizer bpe or gpt2")
        if self.length is None and self.packed:
            self.length = 128
        if self.family is None:
            self.family = self.source if corpus else Path(self.source).name.split(".")[0]
        if self.augment < 0 or (self.augment and not (self.tokenizer in MOLECULE_TOKENIZERS and kind.molecular)):
            raise ValueError(f"data.augment must be >= 0, and > 0 only for molecules "
                             f"({' / '.join(MOLECULE_TOKENIZERS)} tokenizers), "
                             f"got {self.augment} with {self.tokenizer} / {self.metrics}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")

    def model_extra(self) -> dict:
        """What a checkpoint records of its family (``ModelConfig.extra``): the service reads it."""
        return {"family": self.family, "metrics": self.metrics}

    @property
    def packed(self) -> bool:
        return self.tokenizer in PACKED

    @classmethod
    def from_value(cls, value) -> "DataSection":
        """A mapping (the section), a section, or a bare source name or path."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(source=value)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown data keys {unknown}; known: {sorted(known)}")
        return cls(**value)
