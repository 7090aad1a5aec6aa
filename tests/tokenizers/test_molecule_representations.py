"""The molecule representations (SELFIES, SAFE): SMILES data in, their tokens for the model, SMILES out. With
SELFIES every finished sequence of symbols is a valid molecule (the representation's guarantee, which the sampler
inherits)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("selfies")
Chem = pytest.importorskip("rdkit.Chem")

from ttcore.tokenizers import load_tokenizer  # noqa: E402
from ttcore.tokenizers.selfies import SelfiesTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "qm9_sample.txt"


def _canonical(smiles: str) -> str | None:
    mol = Chem.MolFromSmiles(smiles)
    return None if mol is None else Chem.MolToSmiles(mol)


def test_smiles_round_trip_through_selfies_symbols(tmp_path):
    smiles = SAMPLE.read_text().split()[:300]
    tok = SelfiesTokenizer.build(smiles)
    assert tok.length > max(len(s) for s in smiles) // 2 and "[C]" in tok.vocab and "[Branch1]" in tok.vocab
    for s in smiles:
        assert _canonical(tok.decode(tok.encode(s))) == _canonical(s), s
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert isinstance(again, SelfiesTokenizer) and again.vocab == tok.vocab
    partial = tok.encode(smiles[0])
    partial[1] = tok.mask_id
    assert "[MASK]" in tok.decode(partial)  # a partial sequence reads as its symbols
    template = tok.tokenize("[C][MASK][O]", allow_mask=True)
    assert template == [tok.index["[C]"], tok.mask_id, tok.index["[O]"]]
    with pytest.raises(ValueError, match="not encodable as SELFIES"):
        tok.tokenize("C1CC")


def test_any_sequence_of_symbols_decodes_to_a_valid_molecule():
    """Random ids (padding anywhere) decode to SMILES that RDKit parses: what a sampler draws is valid whatever
    the model."""
    tok = SelfiesTokenizer.build(SAMPLE.read_text().split()[:300])
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, tok.vocab_size, (500, tok.length), generator=g)  # [PAD] included, [MASK] not
    texts = [tok.decode(r) for r in rows.tolist()]
    assert all(Chem.MolFromSmiles(t) is not None for t in texts if t)
    assert sum(bool(t) for t in texts) > 450


@pytest.mark.slow
def test_a_selfies_family_trains_and_every_sample_is_valid(tmp_path):
    """``data.tokenizer: selfies`` through the recipe: a few steps, then samples that are all valid molecules."""
    from ttcore.models import load_for_inference
    from ttcore.sampling import generate

    done = subprocess.run([sys.executable, str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--data",
                           str(SAMPLE), "--out", str(tmp_path / "run"), "--max-steps", "3", "--quiet", "--set",
                           "data.tokenizer=selfies", "threads=1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    model, tok, config = load_for_inference(tmp_path / "run", "cpu", "fp32")
    assert tok.kind == "selfies" and config["model"]["extra"]["metrics"] == "molecules"
    *_, last = generate(model, 32, 8, seed=0)
    texts = [tok.decode(r) for r in last.tokens.tolist()]
    assert all(Chem.MolFromSmiles(t) is not None for t in texts if t) and sum(map(bool, texts)) >= 16


def test_safe_round_trip_and_templates(tmp_path):
    """SAFE: SMILES in, SAFE tokens for the model (BRICS fragments, dot-separated, joined by ring-closure digits),
    canonical SMILES out; a template is SAFE as written."""
    pytest.importorskip("safe")
    from ttcore.tokenizers.safe import SafeTokenizer

    smiles = SAMPLE.read_text().split()[:200]
    tok = SafeTokenizer.build(smiles)
    for s in smiles:
        assert _canonical(tok.decode(tok.encode(s))) == _canonical(s), s
    tok.save(tmp_path)
    assert isinstance(load_tokenizer(tmp_path), SafeTokenizer)
    aspirin = SafeTokenizer.build(["CC(=O)Oc1ccccc1C(=O)O"])
    assert "." in "".join(aspirin.vocab) and _canonical(aspirin.decode(aspirin.encode("CC(=O)Oc1ccccc1C(=O)O"))) \
        == _canonical("CC(=O)Oc1ccccc1C(=O)O")
    template = aspirin.tokenize("c1[MASK]ccc1", allow_mask=True)
    assert template[2] == aspirin.mask_id and aspirin.decode(template).startswith("c1[MASK]")  # c, 1, [MASK]
