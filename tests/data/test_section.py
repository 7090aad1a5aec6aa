"""The data section: files in each format, char and SMILES tokenizers, splits, lengths, metrics defaults, and
configs written before the section read as the section they meant."""

import csv
import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from ttcore.data import DataSection, load_dataset, read_sequences
from ttcore.recipes import TrainConfig, load_config
from ttcore.tokenizers import CharTokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]

SEQS = ["ACDK", "GGLK", "MKVLA", "WWY", "KRKRKRK", "AC"]


def test_read_sequences_lines_csv_gzip(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(SEQS) + "\n\n")
    with open(tmp_path / "b.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "sequence"])
        w.writerows([[i, s] for i, s in enumerate(SEQS)])
    with gzip.open(tmp_path / "c.txt.gz", "wt") as f:
        f.write("\n".join(SEQS))
    assert read_sequences(tmp_path / "a.txt") == SEQS
    assert read_sequences(tmp_path / "b.csv", "sequence") == SEQS
    assert read_sequences(tmp_path / "b.csv") == [str(i) for i in range(len(SEQS))]  # the first column
    assert read_sequences(tmp_path / "c.txt.gz") == SEQS
    with pytest.raises(ValueError, match="column 'seq' is not a column"):
        read_sequences(tmp_path / "b.csv", "seq")
    with pytest.raises(FileNotFoundError, match="not found"):
        read_sequences(tmp_path / "missing.txt")


def test_char_family_splits_lengths_and_tokens(tmp_path):
    (tmp_path / "pep.txt").write_text("\n".join(SEQS * 10))
    section = DataSection(source=str(tmp_path / "pep.txt"), tokenizer="char", length=5, val_fraction=0.2)
    assert section.metrics == "none" and section.family == "pep"
    ds = load_dataset(section)
    assert isinstance(ds.tokenizer, CharTokenizer) and ds.tokenizer.length == 5
    assert ds.repeats == 54  # each of the 6 lines once
    dropped = sum(n for reasons in ds.dropped.values() for n in reasons.values())
    assert len(ds.train) + len(ds.val) + dropped == 6 and "KRKRKRK" not in ds.train + ds.val  # longer than 5
    assert len(ds.val) + sum(ds.dropped["val"].values()) == 1  # split first (1 of 6 held out)
    assert all(ds.tokenizer.decode(row) == s for row, s in zip(ds.train_tokens.tolist(), ds.train))
    assert ds.references == {"val": ds.val}
    ds.tokenizer.save(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert tok.to_dict() == ds.tokenizer.to_dict()
    assert tok.tokenize("A[MASK]D[PAD]", allow_mask=True) == [tok.index["A"], tok.mask_id, tok.index["D"], 0]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("AZ")


def test_vocabulary_and_length_come_from_the_training_split_and_lines_are_counted_once(tmp_path):
    """The review: a validation-only symbol became a model output and a validation line set the length. Now the
    tokenizer is the training split's; validation lines it cannot encode are left out and counted per split and
    reason; a repeated line is kept once (never in both splits)."""
    train = ["ACDK", "GGLK", "MKVL", "ACDK", "GGLK"]
    (tmp_path / "train.txt").write_text("\n".join(train))
    (tmp_path / "val.txt").write_text("\n".join(["ACDKGGLKMM", "ACZ", "MKVL", "KLMA", "KLMA"]))
    ds = load_dataset(DataSection(source=str(tmp_path / "train.txt"), val=str(tmp_path / "val.txt"),
                                  tokenizer="char"))
    assert ds.tokenizer.length == 4 and "Z" not in ds.tokenizer.vocab  # the longest training line; its symbols
    assert ds.train == ["ACDK", "GGLK", "MKVL"] and ds.val == ["KLMA"]
    assert ds.dropped["val"] == {"longer than the length (data.length)": 1,
                                 "with symbols outside the training split's vocabulary": 1}
    assert not ds.dropped["train"] and ds.repeats == 2 + 2  # 2 repeated training lines; KLMA twice, MKVL in train
    summary = ds.summary()
    assert "3 training and 1 validation" in summary and "val: 1 longer than the length" in summary
    assert "4 repeated sequences removed" in summary


def test_defaults_and_refusals():
    assert DataSection().metrics == "molecules" and DataSection().family == "qm9"
    text = DataSection(source="text")
    assert (text.tokenizer, text.metrics, text.length) == ("bpe", "text", 128)
    assert DataSection(source="x/peptides.csv.gz", tokenizer="char").family == "peptides"
    with pytest.raises(ValueError, match="data.tokenizer must be one of"):
        DataSection(tokenizer="words")
    with pytest.raises(ValueError, match="molecules needs data.tokenizer: smiles"):
        DataSection(source="p.txt", tokenizer="char", metrics="molecules")
    with pytest.raises(ValueError, match="text is packed into blocks"):
        DataSection(source="text", tokenizer="char")
    with pytest.raises(ValueError, match="unknown data keys"):
        TrainConfig.from_dict({"data": {"source": "p.txt", "tokeniser": "char"}})
    with pytest.raises(ValueError, match="data.val_fraction must be float"):
        TrainConfig.from_dict({"data": {"val_fraction": "a fifth"}})


def test_configs_before_the_section_are_migrated_by_export(tmp_path):
    """Flat keys (every checkpoint's train_config.json before the section records them all, text-only ones
    too) and ``data`` as a bare name: ``training/export.py`` migrates them (the one place they are read); the
    library refuses them, naming it."""
    from export import migrate_train_config

    old = {"data": "qm9", "family": "qm9", "tokenizer": "bpe", "bpe_vocab": 8192, "length": 128,
           "val_fraction": 0.05}
    with pytest.raises(ValueError, match="training/export.py"):
        TrainConfig.from_dict(old)
    assert TrainConfig.from_dict(migrate_train_config(old)).data == DataSection()
    text = migrate_train_config({**old, "data": "text", "family": "text", "bpe_vocab": 300, "length": 16})
    text = TrainConfig.from_dict(text).data
    assert (text.source, text.tokenizer, text.bpe_vocab, text.length, text.family) == ("text", "bpe", 300, 16, "text")
    cfg = TrainConfig.from_dict(migrate_train_config(old))
    from dataclasses import asdict
    assert TrainConfig.from_dict(json.loads(json.dumps(asdict(cfg)))) == cfg  # what checkpoints now record
    assert migrate_train_config(asdict(cfg)) == json.loads(json.dumps(asdict(cfg)))  # current configs pass as they are
    (tmp_path / "c.yaml").write_text("data: text\nlr: 1.0e-3\n")  # a bare source name
    cfg = load_config(tmp_path / "c.yaml", ["data.source=p.txt", "data.tokenizer=char", "lr=3e-4"])
    assert (cfg.data.source, cfg.data.tokenizer, cfg.data.family, cfg.lr) == ("p.txt", "char", "p", 3e-4)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("moses") is None, reason="needs molsets (pip install --no-deps molsets)")
def test_moses_is_a_corpus():
    ds = load_dataset(DataSection(source="moses", val_fraction=0.01))
    assert ds.tokenizer.kind == "smiles" and ds.tokenizer.length == 54 and ds.tokenizer.vocab_size == 25
    assert len(ds.train) + len(ds.val) == 1_584_663 and not any(ds.dropped.values()) and ds.repeats == 0
    assert {k: len(v) for k, v in ds.references.items()} == {"test": 176_074, "test_scaffolds": 176_225}


@pytest.mark.slow
def test_qm9_with_its_own_length_is_read_from_the_package_once(tmp_path, monkeypatch):
    """A packaged corpus with settings its own cache does not cover (here a length; a fine-tune sets its base's)
    is read from the package, then its tokenized split from the split cache (keyed by the package's files)."""
    import numpy as np

    monkeypatch.setenv("TTCORE_CACHE", str(tmp_path / "cache"))
    ds = load_dataset(DataSection(source="qm9", length=12))
    assert ds.tokenizer.length == 12 and ds.dropped["train"]["longer than the length (data.length)"] > 0
    assert len(ds.train) > 1000
    assert all(len(ds.tokenizer.tokenize(s)) <= 12 for s in ds.train[:500])
    again = load_dataset(DataSection(source="qm9", length=12))
    assert again.from_cache and again.train == ds.train and np.array_equal(again.val_tokens, ds.val_tokens)



def test_a_tokenized_split_is_cached_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    """The split, its tokens and what was left out are written once (``ttcore.data.cache``) and read back, equal,
    without tokenizing; a changed file (size or time) is a new entry."""
    import os
    import time

    import numpy as np

    monkeypatch.setenv("TTCORE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "pep.txt").write_text("\n".join(SEQS * 3 + ["ACDKZZZZZZZZZ"]))
    section = DataSection(source=str(tmp_path / "pep.txt"), tokenizer="char", length=6, val_fraction=0.3)
    first = load_dataset(section)
    again = load_dataset(section)
    assert not getattr(first, "from_cache", False) and again.from_cache
    assert again.train == first.train and again.val == first.val and again.repeats == first.repeats
    assert np.array_equal(again.train_tokens, first.train_tokens) and again.train_tokens.dtype == np.int64
    assert again.dropped == first.dropped and again.tokenizer.to_dict() == first.tokenizer.to_dict()
    assert again.summary() == first.summary()
    # a fine-tune's case: the base's tokenizer (the data's own) given back reads the same entry; another does not
    given = load_dataset(section, first.tokenizer)
    assert given.from_cache and given.tokenizer is first.tokenizer
    assert np.array_equal(given.train_tokens, first.train_tokens)
    longer = type(first.tokenizer).from_dict({**first.tokenizer.to_dict(), "length": 7})
    assert not getattr(load_dataset(section, longer), "from_cache", False)
    time.sleep(0.01)
    (tmp_path / "pep.txt").write_text("\n".join(SEQS))
    os.utime(tmp_path / "pep.txt")
    changed = load_dataset(section)
    assert not getattr(changed, "from_cache", False) and changed.repeats == 0


def test_randomized_smiles_augmentation_adds_spellings_of_training_molecules_only(tmp_path):
    """data.augment: k randomized SMILES of each training molecule (the same molecule, another atom order) join the
    training split after the split; validation is untouched; only molecule families may ask for it."""
    pytest.importorskip("rdkit")
    from ttcore.metrics import canonical

    smiles = (ROOT / "tests" / "data" / "qm9_sample.txt").read_text().split()[:200]
    (tmp_path / "m.smi").write_text("\n".join(smiles) + "\n")
    plain = load_dataset(DataSection(source=str(tmp_path / "m.smi")))
    aug = load_dataset(DataSection(source=str(tmp_path / "m.smi"), augment=2))
    assert aug.val == plain.val and len(aug.train) > 2 * len(plain.train)
    assert {canonical(s) for s in aug.train} == {canonical(s) for s in plain.train}  # no new molecule
    assert len(set(aug.train)) > len(set(plain.train))  # new spellings
    with pytest.raises(ValueError, match="data.augment"):
        DataSection(source=str(tmp_path / "m.smi"), tokenizer="char", metrics="none", augment=2)


def test_the_peptide_family_generator_and_its_grammar_agree():
    from ttcore.data.peptides import grammatical, peptides

    seqs = peptides(2000)
    assert all(map(grammatical, seqs)) and len(set(seqs)) > 1900
    assert not any(map(grammatical, ["GAKLIV", "XAGLLGLLKK", "GAGLLGLLQQ", s[::-1] if (s := seqs[0]) else ""]))
