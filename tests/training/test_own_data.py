"""docs/own-data.md, run as written: a family defined only by a config (2,000 peptide-like strings, a char
tokenizer) is pretrained, fine-tuned (TT and rank 1), exported, measured and served, and the page's request
gets peptides back. Only sizes shrink: the config's network and each run's wall time."""

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from servers import free_port, page_argv, playground_generates, spawn, wait_ready

from ttcore.data.peptides import peptides

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-data.md"

pytestmark = pytest.mark.slow


def page_blocks() -> tuple[str, list[str], dict]:
    """The page's config, its commands, and the JSON body of its request."""
    text = PAGE.read_text()
    config = re.search(r'```yaml title="peptides.yaml"\n(.*?)```', text, re.S).group(1)
    bash = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [line for line in bash[0].splitlines() if line.strip()]
    assert "localhost:8001/generate" in bash[1]
    body = json.loads(re.search(r"-d '(\{.*\})'", bash[1]).group(1))
    return config, commands, body


SMOKE_STEPS = {"STEPS": "4", "FT_STEPS": "4"}  # the smallest size: a few steps instead of minutes


def _argv(command: str, env: dict) -> list[str]:
    return page_argv(command, {k: env[k] for k in ("STEPS", "FT_STEPS")})


def test_own_data_page_commands(tmp_path):
    config, commands, body = page_blocks()
    values = yaml.safe_load(config)
    assert values["data"]["tokenizer"] == "char" and values["data"]["family"] == "peptides"
    values["model"] = {"hidden_dim": 32, "cond_dim": 16, "n_blocks": 2, "n_heads": 2}
    values.update(batch_size=32, warmup_steps=2, precision="fp32", val_every=4, val_batches=1, threads=1)
    (tmp_path / "peptides.yaml").write_text(yaml.safe_dump(values))
    train = peptides(2000)
    (tmp_path / values["data"]["source"]).write_text("\n".join(train) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))

    size, *recipes, serve = commands
    assert size.startswith("export STEPS=") and serve.startswith("python -m service")
    assert all("--max-steps" in c for c in recipes if "pretrain.py" in c or "finetune.py" in c)  # budgets by steps
    for command in recipes:
        done = subprocess.run(_argv(command, SMOKE_STEPS), cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peptides.txt", "peptides.yaml", "runs"]  # all under runs/
    runs = tmp_path / "runs"
    fine_tunes = [json.loads((runs / name / "train_state" / "state.json").read_text())
                  for name in ("peptides-tt-r8", "peptides-none-r1")]
    assert [s["step"] for s in fine_tunes] == [4, 4] and not any(s.get("stopped_early") for s in fine_tunes)

    tok = json.loads((runs / "served" / "peptides-tt-r8" / "tokenizer.json").read_text())
    assert tok["type"] == "char" and set(tok["symbols"]) == set("".join(train))
    rows = json.loads((runs / "results" / "peptides" / "likelihood.json").read_text())
    assert {r["checkpoint"] for r in rows} == {"peptides-tt-r8", "peptides-none-r1"}
    assert all(0 < r["nll"] < 10 for r in rows)
    samples = json.loads((runs / "results" / "peptides" / "sequence_results.json").read_text())
    assert {(r["checkpoint"], r["ordering"], r["steps"]) for r in samples} == {
        (c, o, k) for c in ("peptides-tt-r8", "peptides-none-r1") for o in ("random", "top_prob") for k in (4, 16)}
    assert all(0 < r["uniqueness"] <= 1 and 0 <= r["novelty"] <= 1 and r["mean_length"] <= 24 for r in samples)

    port = free_port()
    assert _argv(serve, SMOKE_STEPS)[-2:] == ["--port", "8001"]  # not the port `bash dev.sh run` serves on
    proc = spawn([*_argv(serve, SMOKE_STEPS)[:-2], "--port", port, "--threads", "1", "--precision", "fp32",
                  "--log-level", "warning"], cwd=tmp_path, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 180, proc)
        models = httpx.get(url + "/models").json()["models"]
        assert {(m["model"], m["decomposition"], m["domain"], m["metrics"]) for m in models} == {
            ("peptides", "tt", "char", "none"), ("peptides", "none", "char", "none")}
        r = httpx.post(url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["model"] == "peptides" and answer["decomposition"] == "tt"
        samples = answer["samples"]
        assert len(samples) == body["num_samples"]
        for s in samples:  # peptides over the data's alphabet; no molecule fields for metrics: none
            assert set(s["text"]) <= set(tok["symbols"]) and len(s["text"]) <= 24
            assert s["valid"] is None and s.get("qed") is None
        refused = httpx.post(url + "/generate", json={**body, "valid_only": True}, timeout=30)
        assert refused.status_code in (400, 422) and "valid_only" in refused.text and "none" in refused.text
        playground_generates(url, set(tok["symbols"]), options=2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
