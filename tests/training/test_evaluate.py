"""training/evaluate.py on the tiny checkpoints: tables, CSV/JSON and plots are written."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_evaluate_writes_results(checkpoints, tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "training/evaluate.py", "--checkpoints", str(checkpoints / "qm9-base"),
           str(checkpoints / "qm9-tt-r2"), "--out", str(out), "--samples", "48", "--batch", "24", "--steps", "1", "4",
           "--orderings", "random", "top_prob", "--eb-gammas", "0.0", "5.0", "--eb-max-steps", "30",
           "--data", str(ROOT / "tests" / "data" / "qm9_sample.txt"), "--precision", "fp32"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == 2 * (2 * 2 + 2)
    assert all(0 <= r["validity"] <= 1 and r["samples"] == 48 for r in rows)
    eb = {r["eb_gamma"]: r["avg_steps"] for r in rows if r["checkpoint"] == "qm9-base" and r["eb_gamma"] is not None}
    assert eb[0.0] > eb[5.0]  # gamma = 0 unmasks one token per step: the most steps
    fixed = [r for r in rows if r["eb_gamma"] is None and r["steps"] == 1]
    assert all(r["avg_steps"] == 1 for r in fixed)
    assert (out / "validity.png").stat().st_size > 10_000 and (out / "eb.png").exists()
    assert (out / "results.csv").read_text().startswith("checkpoint,decomposition,rank")
    assert "validity % / uniqueness % / novelty %, ordering top_prob" in done.stdout
