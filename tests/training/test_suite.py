"""training/suite.py at its smallest size: both suites run every recipe they name, and export."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttcore.models import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _suite(*args, timeout=900):
    done = subprocess.run([sys.executable, str(ROOT / "training" / "suite.py"), *map(str, args), "--smoke",
                           "--set", "threads=1"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_cpu_suite_fine_tunes_each_spec_and_exports(checkpoints, tmp_path):
    _suite("cpu", "--base", checkpoints / "qm9-base", "--runs", tmp_path / "runs", "--exports", tmp_path / "out",
           "--steps", 2)
    for name, (dec, rank) in {"qm9-tt-r2": ("tt", 2), "qm9-none-r1": ("none", 1), "qm9-cp-r3": ("cp", 3)}.items():
        model, _, config = load_checkpoint(tmp_path / "out" / name)
        assert (model.cfg.decomposition, model.cfg.rank) == (dec, rank)
        assert "weights in bfloat16" in (tmp_path / "out" / name / "model_card.md").read_text()


def test_device_suite_probes_fits_budgets_and_trains_text(checkpoints, tmp_path):
    out = _suite("device", "--base", checkpoints / "qm9-base", "--runs", tmp_path, "--probe-steps", 2,
                 "--qm9-s", 1, "--text-s", 1, "--ft-s", 1, "--qm9-max", 3, "--text-max", 3, "--ft-max", 2)
    assert "QM9 fine-tunes:" in out and "text TT fine-tune:" in out
    for name in ("qm9-tt-r2", "qm9-none-r1", "qm9-cp-r3", "text-base", "text-tt-r4"):
        model, tok, _ = load_checkpoint(tmp_path / "export" / name)
        assert tok.kind == ("text" if name.startswith("text") else "smiles")
    assert load_checkpoint(tmp_path / "export" / "text-tt-r4")[0].cfg.decomposition == "tt"


def test_ablation_suite_trains_each_lever_and_evaluates_them_side_by_side(checkpoints, tmp_path):
    _suite("ablation", "--base", checkpoints / "qm9-base", "--runs", tmp_path / "runs", "--exports", tmp_path / "res",
           "--steps", 3)
    rows = json.loads((tmp_path / "res" / "results.json").read_text())
    arms = {"none-r1", "tt-r8", "tt-r8-ema", "tt-r8-marginal", "tt-r8-marginal3", "tt-r8-head-lr", "tt-r8-freeze"}
    assert {r["checkpoint"] for r in rows} == arms
    config = json.loads((tmp_path / "runs" / "tt-r8-marginal" / "train_state" / "state.json").read_text())["config"]
    assert config["marginal_weight"] == 1.0 and config["total_steps"] == 3
    config = json.loads((tmp_path / "runs" / "tt-r8-marginal3" / "train_state" / "state.json").read_text())["config"]
    assert config["marginal_weight"] == 3.0
    assert {(r["contraction"], r["joint"]) for r in rows if r["checkpoint"] == "tt-r8"} == {
        ("head", True), ("exact", True), ("head", False), ("exact", False)}


def test_vadd_suite_pretrains_a_vadd_base_and_compares_its_fine_tunes(tmp_path):
    _suite("vadd", "--runs", tmp_path / "runs", "--exports", tmp_path / "res", "--base-steps", 3, "--steps", 2)
    rows = json.loads((tmp_path / "res" / "results.json").read_text())
    assert {r["checkpoint"] for r in rows} == {"vadd", "vadd-cp-r64", "vadd-tt-r8"}
    for name in ("vadd", "vadd-tt-r8"):
        model, _, _ = load_checkpoint(tmp_path / "runs" / name)
        assert model.latent_dim == 8


def test_ablation_arms_selects_and_refuses_unknown_ones(checkpoints, tmp_path):
    # paths relative to where the command runs (here tmp_path), not to the repository the recipes run in
    done = subprocess.run([sys.executable, str(ROOT / "training" / "suite.py"), "ablation", "--base",
                           os.path.relpath(checkpoints / "qm9-base", tmp_path), "--runs", "runs", "--exports", "res",
                           "--steps", "2", "--arms", "none-r1", "--smoke", "--set", "threads=1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {r["checkpoint"] for r in json.loads((tmp_path / "res" / "results.json").read_text())} == {"none-r1"}
    done = subprocess.run([sys.executable, str(ROOT / "training" / "suite.py"), "ablation", "--base",
                           str(checkpoints / "qm9-base"), "--arms", "nope"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "unknown arms ['nope']" in done.stderr


def test_a_missing_base_is_named_with_how_to_get_it(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "training" / "suite.py"), "ablation", "--base",
                           str(tmp_path / "nothing")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "nothing: no checkpoint there" in done.stderr
    assert "pretrain.py --config qm9" in done.stderr and "git checkout" in done.stderr
