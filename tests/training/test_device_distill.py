"""training/device_distill.sh at its rehearsal size on CPU (two grown students side by side, their molecules drawn
by ``evaluate.py --sample-only`` where RDKit cannot be imported), and the molecules measured here by
``evaluate.py --from-samples`` equal to what a direct ``evaluate.py`` run of the same checkpoints measures."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = "tests/data/qm9_sample.txt"  # as the script names it (relative to the checkout): the molecules record it
pytestmark = pytest.mark.slow


def _no_rdkit(tmp_path: Path) -> str:
    """A directory whose ``sitecustomize`` makes ``import rdkit`` fail, as on the device."""
    site = tmp_path / "no-rdkit"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['rdkit'] = None\n")
    return str(site)


def _evaluate(*args, env=None) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "training" / "evaluate.py"), *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_device_distill_rehearsal_and_its_samples_measured_here(checkpoints, tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = dict(os.environ, SMOKE="1", OUT=str(out), PYTHON=sys.executable, RUNS=str(runs),
               TEACHER=str(checkpoints / "qm9-tt-r2"), OMP_NUM_THREADS="1",
               PYTHONPATH=_no_rdkit(tmp_path))  # _lease.sh puts the checkout before it
    done = subprocess.run(["bash", str(ROOT / "training" / "device_distill.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "qm9-tt-r64-d4 exit 0" in done.stdout and "qm9-tt-r64-d2 exit 0" in done.stdout, done.stdout[-3000:]
    assert "sampling exit 0" in done.stdout, done.stdout[-3000:]
    assert re.search(r"^qm9-tt-r64-d2: step 2, [0-9.]+ s/step, student forward-backward-only MFU [0-9.]+% of the",
                     done.stdout, re.M)
    for name, steps, k in (("qm9-tt-r64-d4", 4, 6), ("qm9-tt-r64-d2", 2, 11)):
        config = json.loads((runs / name / "config.json").read_text())["model"]
        assert config["rank"] == 4 and config["decomposition"] == "tt"  # grown from the teacher's 2
        assert config["extra"]["distilled"] == {"teacher": "qm9-tt-r2", "objective": "joint", "steps": steps,
                                                "teacher_steps": k * steps, "teacher_ordering": "random",
                                                "states": "data"}
        assert json.loads((runs / name / "train_state" / "state.json").read_text())["step"] == 2
        kept = sorted(p.name for p in (out / "samples" / name).iterdir())
        assert kept == [f"random-K{k}.{ext}" for k in (1, 2, 4, 8) for ext in ("json", "smi.gz")]
    assert sorted(p.name for p in out.iterdir()) == ["distill.log", "qm9-tt-r64-d2.log", "qm9-tt-r64-d4.log",
                                                     "samples"]
    cut = subprocess.run([sys.executable, str(ROOT / "training" / "evaluate.py"), "--checkpoints",
                          str(runs / "qm9-tt-r64-d4"), "--sample-only", "--samples-dir", str(tmp_path / "cut"),
                          "--samples", "16", "--steps", "1", "--orderings", "random", "--eb-gammas", "--max-minutes",
                          "0"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert cut.returncode == 3 and "stopped at 0 minutes before every setting of qm9-tt-r64-d4" in cut.stdout
    assert not (tmp_path / "cut").exists()  # a setting cut short is not kept

    # measured here from the kept molecules, no checkpoint loaded (the students are not here): the rows a direct
    # run of the students gives (same seeds; the drawing above ran where RDKit was not importable)
    setting = ["--samples", 16, "--steps", 1, 2, 4, 8, "--orderings", "random", "--eb-gammas", "--data", DATA]
    _evaluate("--from-samples", "--samples-dir", out / "samples", "--out", tmp_path / "m", *setting)
    _evaluate("--checkpoints", runs / "qm9-tt-r64-d4", runs / "qm9-tt-r64-d2", "--out", tmp_path / "d", *setting)

    def rows(where):
        return {(r["checkpoint"], r["steps"]): {k: v for k, v in r.items() if k != "seconds"}
                for r in json.loads((where / "results.json").read_text())}
    measured, direct = rows(tmp_path / "m"), rows(tmp_path / "d")
    assert len(measured) == 8 and measured == direct

    # a kept setting is never taken for another: other samples, or a setting not drawn, are refused by name
    refused = subprocess.run([sys.executable, str(ROOT / "training" / "evaluate.py"), "--from-samples",
                              "--samples-dir", str(out / "samples"), "--out", str(tmp_path / "x"), "--samples", "32",
                              "--steps", "1", "--orderings", "random", "--eb-gammas", "--data", DATA],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "was drawn with" in refused.stderr
    missing = subprocess.run([sys.executable, str(ROOT / "training" / "evaluate.py"), "--from-samples",
                              "--samples-dir", str(out / "samples"), "--out", str(tmp_path / "x"), "--samples", "16",
                              "--steps", "3", "--orderings", "random", "--eb-gammas", "--data", DATA],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert missing.returncode != 0 and "no molecules kept for 'random K=3'" in missing.stderr


@pytest.mark.parametrize("args, says", [
    (["--sample-only"], "read or write --samples-dir"),
    (["--sample-only", "--from-samples", "--samples-dir", "s"], "one of them"),
    (["--from-samples", "--samples-dir", "s"], "give --data"),
    (["--sample-only", "--samples-dir", "s", "--cards"], "no --cards"),
    (["--checkpoints", "checkpoints/text-tt-r4", "--samples-dir", "s"], "a family with metrics: molecules"),
])
def test_split_sampling_refuses_what_it_cannot_do(args, says, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "training" / "evaluate.py"), *args, "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
