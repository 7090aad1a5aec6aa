"""The public-domain text corpus: cleaned documents, a stable split by document, cached blocks."""

import pytest

from ttcore.data.text import corpus_documents, is_validation, load_text, training_texts
from ttcore.tokenizers.text import train_bpe


def test_documents_are_clean_and_split_stably():
    docs = corpus_documents()
    ids = [i for i, _ in docs]
    assert len(set(ids)) == len(ids) and sum(i.startswith("sotu/") for i in ids) > 200
    text = " ".join(t for _, t in docs)
    assert "[Applause]" not in text and "[Laughter]" not in text and "Project Gutenberg" not in text
    assert "START OF THE PROJECT" not in text
    val = [i for i in ids if is_validation(i, 0.05)]
    assert 0.02 < len(val) / len(ids) < 0.09
    assert val == [i for i in ids if is_validation(i, 0.05)]


@pytest.mark.slow
def test_packed_blocks_are_cached(tmp_path):
    tok = train_bpe(training_texts()[:40], vocab_size=512, length=64)
    ds = load_text(tok, cache_dir=tmp_path)
    assert ds.train_tokens.shape[1] == 64 and len(ds.val_tokens) > 0
    assert (ds.train_tokens == tok.eot_id).any() and ds.train_tokens.max() < tok.vocab_size
    assert list(tmp_path.glob("text-*.npz"))
    again = load_text(tok, cache_dir=tmp_path)
    assert (again.train_tokens == ds.train_tokens).all()
