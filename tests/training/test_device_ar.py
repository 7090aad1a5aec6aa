"""training/device_ar.sh at its rehearsal size on CPU: both AR models trained side by side (MOSES sized to its
minutes, text to its steps), exported, and packed under $OUT with the logs."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_device_ar_rehearsal(checkpoints, tmp_path):
    tok = tmp_path / "tok"
    for name in ("moses", "text"):
        (tok / name).mkdir(parents=True)
        (tok / name / "tokenizer.json").write_text((checkpoints / "qm9-base" / "tokenizer.json").read_text())
    out = tmp_path / "out"
    env = dict(os.environ, SMOKE="1", OUT=str(out), PYTHON=sys.executable, RUNS=str(tmp_path / "runs"), TOK=str(tok),
               OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(ROOT / "training" / "device_ar.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "moses-ar exit 0" in done.stdout and "text-ar exit 0" in done.stdout, done.stdout[-3000:]
    assert "exported: moses-ar text-ar" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["ar.log", "ar.tar.part-aa", "moses-ar.log", "text-ar.log"]
    with tarfile.open(out / "ar.tar.part-aa") as tar:
        names = set(tar.getnames())
    assert {"moses-ar/config.json", "text-ar/model.safetensors"} <= names
    for name, steps in (("moses-ar", None), ("text-ar", 3)):
        config = json.loads((tmp_path / "runs" / "export" / name / "config.json").read_text())
        assert config["model"]["dit"]["causal"]
        state = json.loads((tmp_path / "runs" / name / "train_state" / "state.json").read_text())
        assert state["step"] == steps if steps else state["step"] >= 11  # text by steps; MOSES past the fit probe
