"""The README's quick start, run as written against the bundled checkpoints on a real server: its curl
commands (the port swapped for the test's), the structured-output page's requests, and its `openai` example
(the base URL swapped)."""

import ast
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from servers import start_uvicorn

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a server


def _quick_start() -> tuple[list[str], str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("## Results")]
    curls = [" ".join(part.strip().rstrip("\\") for part in block.splitlines())
             for block in re.findall(r"^    (curl .*?)(?=\n    curl|\n\n)", section, re.S | re.M)]
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return curls, python


def _structured_output_curls() -> list[str]:
    """The curl commands of docs/structured-output.md's Requests block (a command: its line and the ones it
    continues)."""
    page = (ROOT / "docs" / "structured-output.md").read_text()
    block = re.search(r"## Requests\n\n```bash\n(.*?)```", page, re.S).group(1)
    commands = [c.strip() for c in re.split(r"\n(?=curl )|\n\n", block) if c.strip().startswith("curl ")]
    assert len(commands) == 4, commands
    return commands


def test_the_readme_quick_start_runs_on_the_bundled_checkpoints(capfd):
    curls, python = _quick_start()
    assert len(curls) == 4 and "localhost:8000" in curls[0] and "127.0.0.1:8000" in python
    proc, url = start_uvicorn(ROOT / "checkpoints", "--precision", "auto")  # `bash dev.sh run`'s default
    try:
        port = url.rsplit(":", 1)[1]
        qm9 = subprocess.run(shlex.split(curls[0].replace("localhost:8000", f"localhost:{port}")),
                             capture_output=True, text=True, timeout=120)
        assert qm9.returncode == 0 and '"samples"' in qm9.stdout and '"canonical"' in qm9.stdout, qm9.stdout[-500:]
        text = subprocess.run(shlex.split(curls[1].replace("localhost:8000", f"localhost:{port}")),
                              capture_output=True, text=True, timeout=120)
        assert text.returncode == 0 and "event: step" in text.stdout and "event: done" in text.stdout
        grammar = subprocess.run(shlex.split(curls[2].replace("localhost:8000", f"localhost:{port}")),
                                 capture_output=True, text=True, timeout=300)
        assert grammar.returncode == 0 and '"samples"' in grammar.stdout, grammar.stdout[-500:]
        blocks = subprocess.run(shlex.split(curls[3].replace("localhost:8000", f"localhost:{port}")),
                                capture_output=True, text=True, timeout=120)
        answer = json.loads(blocks.stdout)  # the bundled block checkpoint, one step a block
        assert blocks.returncode == 0 and answer["checkpoint"] == "qm9-b2-tt-r8" and answer["steps"] == 11, answer
        assert len(answer["samples"]) == 4
        for command in _structured_output_curls():  # the structured-output page's requests, as written
            done = subprocess.run(["bash", "-c", command.replace("localhost:8000", f"localhost:{port}")],
                                  capture_output=True, text=True, timeout=300)
            answer = json.loads(done.stdout)
            assert done.returncode == 0 and ("samples" in answer or "choices" in answer), (command, done.stdout[-500:])
        exec(compile(python.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), "README", "exec"), {})
        printed = capfd.readouterr().out.strip()
        molecules = ast.literal_eval(printed)  # the example prints a list of strings
        assert len(molecules) == 4 and all(m.startswith("CC") for m in molecules), printed  # the prompt echoed
    finally:
        proc.terminate()
        proc.wait(timeout=30)
