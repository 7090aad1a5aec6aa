"""Every tokenizer kind answers the ``Tokenizer`` protocol, with the ids it declares where they belong."""

from pathlib import Path

import pytest

from ttcore.tokenizers import CharTokenizer, SmilesTokenizer, Tokenizer, load_tokenizer
from ttcore.tokenizers.text import train_bpe

CHECKPOINTS = Path(__file__).parents[2] / "checkpoints"


def _kinds():
    yield SmilesTokenizer.build(["CCO", "c1ccccc1"])
    yield CharTokenizer.build(["ACGT", "GGA"])
    yield train_bpe(["a cat sat on a mat. " * 20], vocab_size=300, length=16)
    for d in sorted(CHECKPOINTS.iterdir()):
        yield load_tokenizer(d)


@pytest.mark.parametrize("tok", list(_kinds()), ids=lambda t: f"{t.kind}-{t.length}")
def test_every_tokenizer_declares_the_protocol(tok):
    assert isinstance(tok, Tokenizer)
    assert tok.mask_id == tok.vocab_size  # the input-only last id
    assert 0 <= tok.pad_id < tok.mask_id
    if tok.kind == "text":  # documents end at end-of-text, which is also what packs them
        assert tok.end_id == tok.eot_id == tok.pad_id
    else:  # padded sequences run to the length: the padding is drawn as tokens
        assert tok.end_id is None and tok.pads
    ids = tok.encode(tok.decode(tok.tokenize("CC" if tok.kind != "char" else "GA")))
    assert len(ids) == tok.length and tok.mask_id not in ids
