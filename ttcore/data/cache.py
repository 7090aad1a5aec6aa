"""Tokenized splits kept on disk, so that a run (a GPU lease's above all) does not tokenize its data again:
MOSES's 1.58M molecules take minutes to read, deduplicate, split and tokenize, and seconds to load from here.

A cache entry is keyed by what decides its contents: the section's settings, the tokenizer given (a base
model's) and the size and modification time of every source file; any change makes a new entry. It holds the
tokenizer, the token arrays (``.npy``, the smallest integer type that holds the vocabulary), the split's
strings (gzip text, one per line) and what was left out; it is written atomically (a directory renamed into
place) and read without pickle. ``TTCORE_CACHE`` chooses the directory (default ``~/.cache/ttcore``).
"""

import gzip
import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np

from .qm9 import default_cache_dir

CACHE_VERSION = 1


def cache_key(section_values: dict, tokenizer_dict: dict | None, sources: list[Path]) -> str:
    """A hash of the section, the tokenizer given and every source file's size and modification time."""
    stats = [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in sources]
    blob = json.dumps([CACHE_VERSION, section_values, tokenizer_dict, stats], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _write_lines(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        f.write("\n".join(lines))


def _read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    return text.split("\n") if text else []


def save_dataset(ds, key: str, cache_dir: str | Path | None = None) -> Path:
    """Write ``ds`` (a ``SequenceDataset``) under ``key``, atomically -> its directory."""
    root = Path(cache_dir or default_cache_dir())
    final = root / f"split-{key}"
    tmp = root / f".split-{key}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = np.uint8 if ds.tokenizer.mask_id < 256 else np.int32
    for name in ("train", "val"):
        np.save(tmp / f"{name}_tokens.npy", getattr(ds, f"{name}_tokens").astype(dtype))
        _write_lines(tmp / f"{name}.txt.gz", getattr(ds, name))
    meta = {"tokenizer": ds.tokenizer.to_dict(), "repeats": ds.repeats,
            "dropped": {split: dict(reasons) for split, reasons in ds.dropped.items()}}
    (tmp / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_cached(key: str, make_tokenizer, cache_dir: str | Path | None = None):
    """The dataset cached under ``key`` (``make_tokenizer``: the tokenizer class's ``from_dict``), or None."""
    from .sequences import SequenceDataset

    path = Path(cache_dir or default_cache_dir()) / f"split-{key}"
    if not (path / "meta.json").is_file():
        return None
    meta = json.loads((path / "meta.json").read_text())
    ds = SequenceDataset.__new__(SequenceDataset)
    ds.tokenizer, ds.repeats = make_tokenizer(meta["tokenizer"]), meta["repeats"]
    ds.dropped = {split: Counter(reasons) for split, reasons in meta["dropped"].items()}
    for name in ("train", "val"):
        setattr(ds, name, _read_lines(path / f"{name}.txt.gz"))
        setattr(ds, f"{name}_tokens", np.load(path / f"{name}_tokens.npy", allow_pickle=False).astype(np.int64))
    ds.references = {"val": ds.val}
    ds.from_cache = True
    return ds
