"""The packaged corpora, by name (read from PyPI packages by path, no network): ``qm9`` (``qm9pack``), ``moses``
(``molsets``: its own train / test / test_scaffolds files; the package itself does not import on Python 3.11,
so only its data files are read) and ``text`` (public-domain English, ``ttcore.data.text``); and
``read_sequences``, how a file's sequences are read. The ``data:`` section (``section.py``) asks a corpus its
defaults; ``load_dataset`` (``sources.py``) asks it for its sequences."""

import csv
import gzip
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .qm9 import SmilesDataset, load_qm9, qm9_csv_paths

if TYPE_CHECKING:  # annotations only: the section imports this module
    from .section import DataSection


@dataclass(frozen=True)
class Corpus:
    """A packaged corpus, and what ``load_dataset`` asks it: its default tokenizer; ``sequences()``, every
    training sequence (one per example); ``references()``, held-out sets the corpus fixes (MOSES's test sets);
    ``load(section, tokenizer)``, a dataset from its own cached loader, or None where the section asks for
    something that loader does not cover; ``packed``: its documents are packed into blocks (BPE tokenizers only);
    ``files()``: the files ``sequences()`` reads, so that its tokenized split can be cached (``ttcore.data.cache``)."""
    tokenizer: str
    description: str
    sequences: Callable[[], list[str]] | None = None
    references: Callable[[], dict[str, list[str]]] | None = None
    load: Callable | None = None
    packed: bool = False
    files: Callable[[], list[Path]] | None = None  # the files ``sequences()`` reads (what a cached split depends on)


def _qm9_sequences() -> list[str]:
    from .qm9 import read_qm9_smiles

    return read_qm9_smiles()


def _qm9_cached(section: "DataSection", tokenizer):
    """QM9 at its default settings, from the on-disk cache (``load_qm9``)."""
    if section.length is not None or section.val is not None or section.tokenizer != "smiles" or section.augment:
        return None  # the generic path reads, splits and tokenizes it as the section says (and caches it)
    ds = load_qm9(val_fraction=section.val_fraction)
    if tokenizer is not None and tokenizer.to_dict() != ds.tokenizer.to_dict():
        ds = SmilesDataset(ds.train, ds.val, tokenizer)  # re-encode with the base model's tokenizer
    ds.references = {"test": read_sequences(section.test)} if section.test else {"val": ds.val}
    return ds


def _gpt2(section: "DataSection"):
    from ttcore.tokenizers.text import gpt2_bpe

    return gpt2_bpe(section.length)


def _trained_bpe(section: "DataSection"):
    from ttcore.tokenizers.text import train_bpe

    from .text import training_texts

    return train_bpe(training_texts(section.val_fraction), section.bpe_vocab, section.length)


TEXT_TOKENIZERS = {"gpt2": _gpt2, "bpe": _trained_bpe}  # a packed corpus's data.tokenizer -> its tokenizer


def _text_corpus(section: "DataSection", tokenizer):
    """The public-domain corpus, split by document and packed into blocks (``load_text``, cached), tokenized by
    the section's ``TEXT_TOKENIZERS`` entry unless a base model's ``tokenizer`` is given."""
    from .text import load_text

    tokenizer = tokenizer or TEXT_TOKENIZERS[section.tokenizer](section)
    return load_text(tokenizer, val_fraction=section.val_fraction)


def _moses_references() -> dict[str, list[str]]:
    return {name: read_sequences(path) for name, path in moses_files().items() if name != "train"}


CORPORA = {
    "qm9": Corpus("smiles", "QM9: 133,885 small organic molecules (<= 9 heavy atoms), canonical SMILES",
                  sequences=_qm9_sequences, load=_qm9_cached, files=qm9_csv_paths),
    "moses": Corpus("smiles", "MOSES: 1.9M drug-like molecules from ZINC, with the benchmark's train / test / "
                              "scaffold-test splits",
                    sequences=lambda: read_sequences(moses_files()["train"]), references=_moses_references,
                    files=lambda: list(moses_files().values())),
    "text": Corpus("bpe", "public-domain English: State of the Union addresses and Project Gutenberg books",
                   load=_text_corpus, packed=True),
}


def read_sequences(path: str | Path, column: str | None = None) -> list[str]:
    """A file's sequences: one per non-empty line (.txt, .smi, anything), or one column of a .csv (the first
    unless named); a trailing .gz is read through gzip."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} not found")
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    raw = gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else open(path, encoding="utf-8")
    with raw as f:
        if name.endswith(".csv"):
            reader = csv.DictReader(f)
            col = column or reader.fieldnames[0]
            if col not in reader.fieldnames:
                raise ValueError(f"data.column {col!r} is not a column of {path.name}: {reader.fieldnames}")
            return [row[col].strip() for row in reader if row[col] and row[col].strip()]
        if column is not None:
            raise ValueError(f"data.column is for .csv files; {path.name} is read one sequence per line")
        return [line.strip() for line in f if line.strip()]


def moses_files() -> dict[str, Path]:
    """The MOSES splits shipped in ``molsets`` (found by spec: importing it fails on Python 3.11), or in the
    directory ``TTCORE_MOSES_DIR`` names (the same three files copied to a machine without the package)."""
    if os.environ.get("TTCORE_MOSES_DIR"):
        data = Path(os.environ["TTCORE_MOSES_DIR"])
    else:
        spec = importlib.util.find_spec("moses")
        data = Path(spec.origin).parent / "dataset" / "data" if spec and spec.origin else None
    if data is None or not (data / "train.csv.gz").is_file():
        raise FileNotFoundError("MOSES needs the PyPI package molsets (pip install --no-deps molsets==0.3.1), or "
                                "TTCORE_MOSES_DIR naming a directory with its train / test / test_scaffolds .csv.gz")
    return {name: data / f"{name}.csv.gz" for name in ("train", "test", "test_scaffolds")}
