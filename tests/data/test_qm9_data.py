import json
from pathlib import Path

import pytest

from ttcore.data import SmilesDataset, load_qm9, qm9

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "qm9_sample.txt"


def test_sample_file_split_is_deterministic():
    a, b = SmilesDataset.from_file(SAMPLE), SmilesDataset.from_file(SAMPLE)
    assert a.train == b.train and a.val == b.val
    assert len(a.val) == 300 and not set(a.train) & set(a.val)
    assert (a.train_tokens[:, 0] != a.tokenizer.pad_id).all()


@pytest.mark.slow
def test_full_qm9_from_package_is_cached(tmp_path, monkeypatch):
    ds = load_qm9(cache_dir=tmp_path)
    assert 120_000 < len(ds.train) + len(ds.val) < 131_000
    assert ds.tokenizer.length == 22  # QM9 canonical SMILES: at most 22 atom-level tokens
    assert list(tmp_path.glob("qm9-*.json"))
    again = load_qm9(cache_dir=tmp_path)
    assert again.val == ds.val and (again.train_tokens == ds.train_tokens).all()
    # a cache made for other CSV files is rebuilt; without the package, a copied cache is used as is
    cache = next(tmp_path.glob("qm9-*.json"))
    d = json.loads(cache.read_text())
    cache.write_text(json.dumps(dict(d, sources=[1, 2, 3], val=d["val"][:5])))
    assert load_qm9(cache_dir=tmp_path).val == ds.val
    cache.write_text(json.dumps(dict(d, val=d["val"][:5])))
    monkeypatch.setattr(qm9, "qm9_csv_paths", _no_package)
    assert load_qm9(cache_dir=tmp_path).val == ds.val[:5]
    with pytest.raises(FileNotFoundError, match="qm9pack"):
        load_qm9(cache_dir=tmp_path / "empty")


def _no_package():
    raise FileNotFoundError("QM9 needs the PyPI package qm9pack")
