import pytest

from ttcore.tokenizers import SmilesTokenizer, smiles_tokens


def test_atom_level_tokens():
    assert smiles_tokens("C[NH3+]Cl.Br%12c1ccccc1/C=C\\O") == [
        "C", "[NH3+]", "Cl", ".", "Br", "%12", "c", "1", "c", "c", "c", "c", "c", "1", "/", "C", "=", "C", "\\", "O"]
    with pytest.raises(ValueError, match="not a tokenizable SMILES"):
        smiles_tokens("C{C}")


def test_round_trip_padding_and_errors(tmp_path):
    tok = SmilesTokenizer.build(["CC(=O)O", "c1ccncc1", "C#N"])
    assert tok.length == 8 and tok.vocab[0] == "[PAD]" and tok.vocab[-1] == "[MASK]"
    ids = tok.encode("CC=O")
    assert len(ids) == 8 and ids[4:] == [tok.pad_id] * 4
    assert tok.decode(ids) == "CC=O"
    tok.save(tmp_path)
    from ttcore.tokenizers import load_tokenizer
    again = load_tokenizer(tmp_path)
    assert again.vocab == tok.vocab and again.length == tok.length
    with pytest.raises(ValueError, match="token 'F' is not in the vocabulary"):
        tok.encode("CF")
    with pytest.raises(ValueError, match="more than the model length 8"):
        tok.encode("CCCCCCCCC")
    assert tok.tokenize("C[MASK]O", allow_mask=True) == [tok.index["C"], tok.mask_id, tok.index["O"]]
    with pytest.raises(ValueError):
        tok.tokenize("C[MASK]O")


def test_templates_fix_end_padding_with_pad():
    tok = SmilesTokenizer.build(["CC(=O)O", "c1ccncc1", "C#N"])
    c = tok.index["C"]
    assert tok.tokenize("CC[MASK][PAD][PAD]", allow_mask=True) == [c, c, tok.mask_id, tok.pad_id, tok.pad_id]
    with pytest.raises(ValueError, match="'\\[PAD\\]' is not in the vocabulary"):
        tok.tokenize("CC[PAD]")  # data, not a template: [PAD] is never a SMILES token
