"""The MOSES table recipe at its smallest size: tiny checkpoints trained on 3,000 MOSES training molecules,
sampled at two step counts and with EB, measured in MOSES's columns beside the published rows."""

import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("moses") is None,
                                                   reason="needs molsets (pip install --no-deps molsets==0.3.1)")]


def _run(*args, env):
    done = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_moses_table_recipe(tmp_path):
    from ttcore.data import moses_files, read_sequences
    from ttcore.metrics.moses import PUBLISHED

    (tmp_path / "moses3k.smi").write_text("\n".join(read_sequences(moses_files()["train"])[:3000]))
    env = dict(os.environ, OMP_NUM_THREADS="1", TTCORE_CACHE=str(tmp_path / "cache"))
    small = ["--config", "tiny", "--data", tmp_path / "moses3k.smi", "--quiet", "--set", "threads=1", "val_batches=1"]
    _run("training/pretrain.py", *small, "--out", tmp_path / "ck" / "base", "--max-steps", 4, env=env)
    _run("training/finetune.py", *small, "--base", tmp_path / "ck" / "base", "--decomposition", "tt", "--rank", 2,
         "--out", tmp_path / "ck" / "tt", "--max-steps", 3, env=env)
    printed = _run("training/evaluate_moses.py", "--checkpoints", tmp_path / "ck", "--out", tmp_path / "r",
                   "--samples", 24, "--batch", 12, "--steps", 2, 4, "--eb-gammas", 1.0, "--reference-limit", 300,
                   "--precision", "fp32", "--adaptive-path", "fast", env=env)
    rows = json.loads((tmp_path / "r" / "moses.json").read_text())
    assert [(r["checkpoint"], r["sampler"]) for r in rows] == [
        (c, s) for c in ("base", "tt") for s in ("random K=2", "random K=4", "EB gamma=1 fast")]
    for r in rows:
        assert r["samples"] == 24 and 0 <= r["valid"] <= 1 and r["unique@1k"] is None  # fewer than 1,000 valid
        assert r["n_valid"] == round(24 * r["valid"]) and 0 <= r["quality"] <= r["valid"]
        if r["n_valid"] >= 2:
            assert r["fcd/test"] > 0 and 0 <= r["snn/testsf"] <= 1 and 0 <= r["int_div2"] <= r["int_div"] + 1e-9
    table = (tmp_path / "r" / "moses.md").read_text()
    assert all(f"| {name} (published) |" in table for name in PUBLISHED)
    assert "the first 300 of each, not MOSES's full sets" in table and table in printed
    assert len(list((tmp_path / "cache" / "moses-references").glob("*.npz"))) == 2  # cached for the next run

    # sampled on one machine (a GPU lease: --sample-only, no RDKit needed), measured on another: the same rows
    sampling = ["training/evaluate_moses.py", "--checkpoints", tmp_path / "ck", "--samples", 24, "--batch", 12,
                "--steps", 2, 4, "--eb-gammas", 0.5, 1.0, "--precision", "fp32", "--adaptive-path", "fast",
                "--samples-dir", tmp_path / "s"]
    cut = subprocess.run([sys.executable, *map(str, sampling), "--sample-only", "--max-minutes", "0"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert cut.returncode == 3 and "0 of 8 settings drawn" in cut.stdout, cut.stdout + cut.stderr[-2000:]
    _run(*sampling, "--sample-only", env=env)
    kept = sorted(p.relative_to(tmp_path / "s").as_posix() for p in (tmp_path / "s").rglob("*.json"))
    assert kept == [f"{c}/{s}.json" for c in ("base", "tt")
                    for s in ("EB-gamma0.5-fast", "EB-gamma1-fast", "random-K2", "random-K4")]
    _run(*sampling, "--out", tmp_path / "r2", "--reference-limit", 300, env=env)
    again = json.loads((tmp_path / "r2" / "moses.json").read_text())
    same = [r for r in again if r["sampler"] != "EB gamma=0.5 fast"]  # the settings of the table above
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in same] == [
        {k: v for k, v in r.items() if k != "seconds"} for r in rows]
    from ttcore.metrics import molecule_metrics  # the MOSES table's quality is the molecule metrics' quality

    with gzip.open(tmp_path / "s" / "tt" / "random-K2.smi.gz", "rt") as f:
        texts = f.read().split("\n")
    row = next(r for r in again if (r["checkpoint"], r["sampler"]) == ("tt", "random K=2"))
    assert len(texts) == 24 and row["quality"] == molecule_metrics(texts)["quality"]
    (tmp_path / "s" / "tt" / "random-K2.json").write_text(json.dumps({"samples": 99}))
    clash = subprocess.run([sys.executable, *map(str, sampling), "--sample-only"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
    assert clash.returncode != 0 and "not {" in clash.stderr  # kept molecules of another run are never reused


def _copy_working_tree(dest: Path):
    """What the device tool carries: tracked files and untracked ones git does not ignore (never a virtual
    environment, a docs build or a data cache that happen to sit in the checkout: CI's ``.venv-guidellm`` copied so
    filled its disk), less the bundled checkpoints and results the lease script does not read."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in listed:
        if name and not name.startswith(("checkpoints/", "results/")) and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def test_the_gpu_lease_moses_script_runs_at_smoke_size(tmp_path):
    """training/device_moses.sh at its rehearsal size on CPU, with the MOSES file given as a directory (as the
    device, which has no registry, gets it): the base and the TT r=8 fine-tune sized to their minutes, the
    rank-1 fine-tune at the TT's steps, exports as family moses, samples drawn until the time is spent; a
    second call skips what is done, and a later lease carrying the pair's exports only samples."""
    from ttcore.data import moses_files

    lease = tmp_path / "moses"  # MOSES's three files as the device gets them, cut to their first 4,000 molecules:
    lease.mkdir()  # the path is the same, and tokenizing the whole 1.6M-molecule split would cost ~90 s of CPU
    for name, path in moses_files().items():
        with gzip.open(path, "rt") as src, gzip.open(lease / path.name, "wt") as dest:
            dest.writelines(line for _, line in zip(range(4001), src))  # the header and 4,000 molecules
    absent = tmp_path / "absent" / "rdkit"  # as on the device: no RDKit (an import of it fails)
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text("raise ImportError('RDKit is not installed on the device')\n")
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path / "out"), PYTHON=sys.executable, RUNS=str(tmp_path / "runs"),
               TTCORE_MOSES_DIR=str(lease), OMP_NUM_THREADS="1", PYTHONPATH=str(absent.parent))

    def call(**more):
        done = subprocess.run(["bash", str(ROOT / "training" / "device_moses.sh")], cwd=ROOT, env=dict(env, **more),
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return done.stdout

    printed = call()
    for name in ("base", "moses-tt-r8", "moses-none-r1"):
        assert f"{name} exit 0" in printed
    steps = {}
    for name in ("moses-base", "moses-tt-r8", "moses-none-r1"):
        extra = json.loads((tmp_path / "runs" / "export" / name / "config.json").read_text())["model"]["extra"]
        assert extra["family"] == "moses" and extra["metrics"] == "molecules"
        steps[name] = json.loads((tmp_path / "runs" / name / "train_state" / "state.json").read_text())["step"]
    assert steps["moses-base"] >= 11 and steps["moses-tt-r8"] >= 11  # sized by --fit-minutes past its probe
    assert steps["moses-none-r1"] == steps["moses-tt-r8"]  # the equal budget
    assert re.search(r"^fit 0.01 minutes: .* steps$", printed, re.M)
    assert "sampling exit 0" in printed and sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "moses.log", "pair.tar.part-aa", "samples.tgz"]
    with tarfile.open(tmp_path / "out" / "samples.tgz") as tar:
        kept = sorted(m.name for m in tar.getmembers() if m.name.endswith(".json"))
    assert kept == [f"./{c}/{s}.json" for c in ("moses-none-r1", "moses-tt-r8")
                    for s in ("EB-gamma1-fast", "random-K2")]
    assert re.search(r"^lease: \d+ s of training steps in \d+ s of wall time \(\d+%", printed, re.M), printed[-2000:]
    assert re.search(r"^training phase: \d+ s of training steps in \d+ s \(\d+%", printed, re.M), printed[-2000:]

    again = call()  # the machine still warm: nothing is trained or drawn again
    assert "exit 0" not in again.replace("sampling exit 0", "") and again.count("(kept from an earlier run)") == 4

    # a later lease: the pair's exports and the samples carried back, nothing trained; too little time to sample
    carry = tmp_path / "later"
    _copy_working_tree(carry)
    shutil.copytree(tmp_path / "runs" / "export", carry / ".lease" / "moses-export",
                    ignore=shutil.ignore_patterns("moses-base"))
    later = subprocess.run(["bash", str(carry / "training" / "device_moses.sh")], cwd=carry,
                           env=dict(env, RUNS=str(tmp_path / "runs2"), OUT=str(tmp_path / "out2"), LEASE_SECONDS="0"),
                           capture_output=True, text=True, timeout=900)
    assert later.returncode == 0, later.stdout[-3000:] + later.stderr[-2000:]
    assert "base exit" not in later.stdout and "r1 exit" not in later.stdout and "r8 exit" not in later.stdout
    assert "sampling for at most 0 minutes" in later.stdout and "0 of 4 settings drawn" in later.stdout
