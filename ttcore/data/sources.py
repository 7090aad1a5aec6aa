"""Where a family's sequences come from: a packaged corpus by name (``corpora.py``), or a file; and
``load_dataset``, which turns a ``DataSection`` into train / validation token arrays, a tokenizer and the
held-out references."""

from pathlib import Path

from .corpora import CORPORA, Corpus, read_sequences
from .qm9 import split
from .section import DataSection
from .sequences import SequenceDataset


def _symbol_tokenizer(kind: str):
    from ttcore.tokenizers import CharTokenizer, SmilesTokenizer

    if kind in ("selfies", "safe"):  # their packages are extras: imported when a family asks for them
        from ttcore.tokenizers import _EXTRAS
        return _EXTRAS[kind]()
    return {"smiles": SmilesTokenizer, "char": CharTokenizer}[kind]


def _packed(section: DataSection, train: list[str], val: list[str], tokenizer):
    """Documents joined with end-of-text and cut into blocks (bpe / gpt2)."""
    from ttcore.tokenizers.text import gpt2_bpe, train_bpe

    from .text import TextDataset, pack

    if tokenizer is None:
        tokenizer = (gpt2_bpe(section.length) if section.tokenizer == "gpt2"
                     else train_bpe(train, section.bpe_vocab, section.length))
    return TextDataset(tokenizer, pack(tokenizer, train), pack(tokenizer, val))


def load_dataset(section: DataSection, tokenizer=None):
    """The family ``section`` defines, tokenized; with ``tokenizer`` (a base model's), encoded with it instead of
    building one from the data."""
    corpus = CORPORA.get(section.source)
    if not section.packed and tokenizer is not None and tokenizer.kind != section.tokenizer \
            and not tokenizer.any_text:
        raise ValueError(f"data.tokenizer is {section.tokenizer!r}, the base model's tokenizer {tokenizer.kind!r}")
    if corpus is not None and corpus.load is not None:
        ds = corpus.load(section, tokenizer)
        if ds is not None:
            return ds
    if not section.packed:  # one example a line: tokenized once, then from the on-disk cache
        return _cached_sequences(section, tokenizer, corpus)
    # documents: repeats are text, and the blocks cut across them
    seqs = corpus.sequences() if corpus is not None else read_sequences(section.source, section.column)
    train, val = (seqs, read_sequences(section.val, section.column)) if section.val is not None else \
        split(seqs, section.val_fraction, 0)
    return _packed(section, train, val, tokenizer)


def _source_files(section: DataSection, corpus: Corpus | None) -> list[Path] | None:
    """The files a section's sequences come from (what its cache entry depends on), or None where they are not
    files we can see (a corpus read by its own loader)."""
    if corpus is None:
        paths = [Path(section.source)]
    elif corpus.files is not None:
        try:
            paths = corpus.files()
        except FileNotFoundError:  # its package is absent: reading the corpus says so
            return None
    else:
        return None
    paths += [Path(p) for p in (section.val, section.test) if p is not None]
    return paths


def _cached_sequences(section: DataSection, tokenizer, corpus: Corpus | None) -> SequenceDataset:
    """``_sequence_dataset`` through the on-disk cache (``ttcore.data.cache``)."""
    from dataclasses import asdict

    from .cache import cache_key, load_cached, save_dataset

    sources = _source_files(section, corpus)
    if sources is None:
        return _sequence_dataset(section, tokenizer, corpus)
    key = cache_key(asdict(section), tokenizer.to_dict() if tokenizer is not None else None, sources)
    # the key holds a given tokenizer whole: a hit was encoded by it (no need to rebuild it from the entry)
    restore = (lambda _: tokenizer) if tokenizer is not None else _symbol_tokenizer(section.tokenizer).from_dict
    ds = load_cached(key, restore)
    if ds is None and tokenizer is not None:  # the entry the data's own tokenizer made, where that is this one (a
        # fine-tune of a base trained on the same section): its tokens are this tokenizer's
        own = load_cached(cache_key(asdict(section), None, sources), lambda saved: saved)
        if own is not None and own.tokenizer == tokenizer.to_dict():
            own.tokenizer, ds = tokenizer, own
    if ds is None:
        ds = _sequence_dataset(section, tokenizer, corpus)
        try:
            save_dataset(ds, key)
        except OSError:  # a read-only or full disk: the run goes on without the cache
            pass
    references = corpus.references() if corpus is not None and corpus.references is not None else None
    if section.test is not None:
        references = {"test": read_sequences(section.test, section.column)}
    ds.references = references or {"val": ds.val}
    return ds


def _sequence_dataset(section: DataSection, tokenizer, corpus: Corpus | None) -> SequenceDataset:
    """One example a line: read, deduplicated, split, tokenized (the training split's vocabulary)."""
    seqs = corpus.sequences() if corpus is not None else read_sequences(section.source, section.column)
    # each sequence once, so that no line is in both splits or weighs twice
    distinct = list(dict.fromkeys(seqs))
    repeats = len(seqs) - len(distinct)
    if section.val is not None:
        train, held_out = distinct, read_sequences(section.val, section.column)
        seen = set(train)
        val = [s for s in dict.fromkeys(held_out) if s not in seen]
        repeats += len(held_out) - len(val)
    else:
        train, val = split(distinct, section.val_fraction, 0)
    if section.augment:  # after the split: no molecule of the validation split is seen in another spelling
        from ttcore.metrics.molecules import randomized_smiles

        train = train + [r for k, s in enumerate(train) for r in randomized_smiles(s, section.augment, seed=k)]
    if tokenizer is None:  # the vocabulary and the default length are the training split's alone
        tokenizer = _symbol_tokenizer(section.tokenizer).build(train, section.length)
    references = corpus.references() if corpus is not None and corpus.references is not None else None
    if section.test is not None:
        references = {"test": read_sequences(section.test, section.column)}
    return SequenceDataset(train, val, tokenizer, references, repeats)
