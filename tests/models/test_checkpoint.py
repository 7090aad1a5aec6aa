import json

import pytest
import torch

from ttcore.models import CheckpointError, DiTConfig, JointModel, ModelConfig, load_checkpoint, save_checkpoint
from ttcore.tokenizers import SmilesTokenizer


def _saved(tmp_path):
    torch.manual_seed(0)
    tok = SmilesTokenizer.build(["CCO", "c1ccccc1", "N#N"])
    base = JointModel(ModelConfig(DiTConfig(vocab_size=tok.vocab_size + 1, out_vocab=tok.vocab_size,
                                            length=tok.length, hidden_dim=16, cond_dim=8, n_blocks=1, n_heads=2)))
    model = JointModel.from_base(base, "tt", 2, "1layer", noise=0.1)
    save_checkpoint(tmp_path / "ck", model, tok, model_card="# card")
    return model, tok, tmp_path / "ck"


def test_round_trip_is_bit_exact(tmp_path):
    model, tok, path = _saved(tmp_path)
    loaded, tok2, config = load_checkpoint(path)
    assert config["model"]["decomposition"] == "tt" and tok2.vocab == tok.vocab
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert not list(tmp_path.glob(".ck.tmp-*"))  # no temporary directory left behind


def test_truncated_or_corrupted_checkpoint_is_refused(tmp_path):
    _, _, path = _saved(tmp_path)
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(path)
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    weights.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(path)
    weights.write_bytes(data)
    load_checkpoint(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not readable UTF-8 JSON"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_checkpoint(tmp_path)


def test_mismatched_weights_are_refused(tmp_path):
    _, _, path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["model"]["rank"] = 3
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="do not fit the configured model"):
        load_checkpoint(path)


def test_interrupted_swap_falls_back_to_old(tmp_path):
    _, _, path = _saved(tmp_path)
    path.rename(path.with_name("ck.old"))
    load_checkpoint(path)
