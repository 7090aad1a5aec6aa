"""Tokenized splits kept on disk, so that a run (a GPU lease's above all) does not tokenize its data again:
MOSES's 1.58M molecules take minutes to read, deduplicate, split and tokenize, and seconds to load from here.

A cache entry is keyed by what decides its contents: the section's settings, the tokenizer given (a base
model's) and the contents of every source file (SHA-256), not where they lie, so an entry copied to another
machine with the same files serves there; any change makes a new entry. It holds the tokenizer, the token
arrays (compressed ``.npz``, the smallest integer type that holds the vocabulary: MOSES's 1.58M molecules in
about 17 MB), the split's strings (gzip text, one per line) and what was left out; it is written atomically (a
directory renamed into place) and read without pickle. ``TTCORE_CACHE`` chooses the directory (default
``~/.cache/ttcore``). MOSES: 33 s to build on two cores, 2.3 s to load.
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
    """A hash of the section (its file paths by name only), the tokenizer given and every source file's
    contents, so that a cache copied to another machine (a GPU lease) with the same files there matches."""
    values = {k: Path(v).name if k in ("source", "val", "test") and v else v for k, v in section_values.items()}
    contents = []
    for p in sources:
        with open(p, "rb") as f:
            contents.append([p.name, hashlib.file_digest(f, "sha256").hexdigest()])
    blob = json.dumps([CACHE_VERSION, values, tokenizer_dict, contents], sort_keys=True, default=str)
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
        np.savez_compressed(tmp / f"{name}_tokens.npz", tokens=getattr(ds, f"{name}_tokens").astype(dtype))
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
        with np.load(path / f"{name}_tokens.npz", allow_pickle=False) as arrays:
            setattr(ds, f"{name}_tokens", arrays["tokens"].astype(np.int64))
    ds.references = {"val": ds.val}
    ds.from_cache = True
    return ds
