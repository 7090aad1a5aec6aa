"""docs/pretrained.md, run as written on tiny random masked LMs of three architectures (BERT, ModernBERT, ESM)
that this test writes with ``save_pretrained``, each with a tokenizer it builds: fine-tuned into an MDM, then a
TT r = 4 joint model, exported, served, and the page's request answered with peptides. Only the steps shrink."""

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from servers import free_port, page_argv, playground_generates, spawn, wait_ready

from ttcore.data.peptides import peptides

pytest.importorskip("transformers")
from ttcore.models.hf_random import write_random_masked_lm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "pretrained.md"

pytestmark = pytest.mark.slow


def page_blocks() -> tuple[list[str], dict]:
    """The page's commands and the JSON body of its request."""
    bash = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    commands = [line for line in bash[0].splitlines() if line.strip()]
    assert "localhost:8002/generate" in bash[1]
    return commands, json.loads(re.search(r"-d '(\{.*\})'", bash[1]).group(1))


def _argv(command: str, env: dict) -> list[str]:
    return page_argv(command, {k: env[k] for k in ("BASE", "STEPS")})


@pytest.mark.parametrize("kind", ["bert", "modernbert", "esm"])
def test_pretrained_page_commands(tmp_path, kind):
    commands, body = page_blocks()
    setup, *recipes, serve = commands
    assert setup.startswith("export BASE=") and serve.startswith("python -m service")
    assert all("--max-steps $STEPS" in c for c in recipes if "finetune.py" in c)
    base = write_random_masked_lm(kind, tmp_path / "base")
    train = peptides(600)
    (tmp_path / "peptides.txt").write_text("\n".join(train) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), BASE=str(base), STEPS="3")
    for command in recipes:
        done = subprocess.run(_argv(command, env), cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    state = json.loads((tmp_path / "runs" / "hf-tt-r4" / "train_state" / "state.json").read_text())
    assert state["step"] == 3 and state["config"]["model"]["decomposition"] == "tt"
    config = json.loads((tmp_path / "served" / "peptides-tt-r4" / "config.json").read_text())
    assert config["model"]["backbone"]["model_type"] == kind

    port = free_port()
    argv = _argv(serve, env)
    assert argv[-2:] == ["--port", "8002"]
    proc = spawn([*argv[:-2], "--port", port, "--threads", "1", "--log-level", "warning"], cwd=tmp_path, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 180, proc)
        models = httpx.get(url + "/models").json()["models"]
        assert [(m["model"], m["decomposition"], m["rank"], m["domain"]) for m in models] == [
            ("peptides", "tt", 4, "hf")]
        r = httpx.post(url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        samples = r.json()["samples"]
        alphabet = set("".join(train)) | set("CNOSFclnos()[]=#123456+-@H")  # the tiny tokenizers' symbols
        assert len(samples) == body["num_samples"] and all(set(s["text"]) <= alphabet for s in samples)
        score = httpx.post(url + "/score", json={"model": "peptides", "sequences": train[:2], "mode": "joint"},
                           timeout=60)
        assert score.status_code == 200 and all(s["log_prob"] < 0 for s in score.json()["scores"])
        v1 = httpx.post(url + "/v1/completions", json={"model": "peptides-tt-r4", "prompt": "G", "n": 2,
                                                        "steps": 4}, timeout=60)
        assert v1.status_code == 200 and len(v1.json()["choices"]) == 2
        if kind == "esm":
            playground_generates(url, alphabet, options=1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
