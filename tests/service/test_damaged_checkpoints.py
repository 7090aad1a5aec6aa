"""Start-up survives any damage to any file of any checkpoint: the damaged one is refused with its
reason (by name, never a path of this machine), the others are served."""

import logging
import os
import re
import shutil

import pytest

from service.registry import ModelRegistry
from ttcore.data import SmilesDataset
from ttcore.models import DiTConfig, JointModel, ModelConfig, save_checkpoint

FILES = ["config.json", "model.safetensors", "tokenizer.json", "model_card.md"]


def _damage(path, how):
    if how == "removed":
        path.unlink()
    elif how == "directory":
        path.unlink()
        path.mkdir()
        (path / "x").write_text("{}")
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])
    elif how == "random bytes":
        path.write_bytes(os.urandom(512) + b"\xff\xfe")
    else:
        path.write_text(how)  # "[]" or "{}"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    from servers import SAMPLE
    tok = SmilesDataset.from_file(SAMPLE).tokenizer
    root = tmp_path_factory.mktemp("good")
    model = JointModel(ModelConfig(DiTConfig.for_tokenizer(tok, hidden_dim=16, cond_dim=8, n_blocks=1, n_heads=2)))
    save_checkpoint(root / "ok", JointModel.from_base(model, "tt", 2), tok, model_card="# a card\n")
    return root / "ok"


@pytest.mark.parametrize("how", ["[]", "{}", "random bytes", "truncated", "directory", "removed"])
@pytest.mark.parametrize("name", FILES)
def test_each_damaged_file_refuses_only_its_checkpoint(good, tmp_path, caplog, name, how):
    shutil.copytree(good, tmp_path / "intact")
    shutil.copytree(good, tmp_path / "damaged")
    _damage(tmp_path / "damaged" / name, how)
    with caplog.at_level(logging.WARNING):
        registry = ModelRegistry(tmp_path, "cpu", "fp32")
    served = {lm.name: lm for lm in registry.models}
    assert "intact" in served and served["intact"].card == "# a card\n"
    if name == "model_card.md":  # the card is documentation: the model is served without it
        assert "damaged" in served and not registry.refused
        assert served["damaged"].card in (None, how) or how in ("truncated",)
    else:
        assert set(registry.refused) == {"damaged"} and "damaged" not in served
        reason = registry.refused["damaged"]
        assert name.split(".")[0] in reason or "weights" in reason, reason
        assert str(tmp_path) not in reason and not re.search(r"(^|[\s(])/\w", reason), reason  # no absolute path
        assert sum("refusing checkpoint damaged" in r.getMessage() for r in caplog.records) == 1
