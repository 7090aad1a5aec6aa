"""schemathesis against the live app's /openapi.json: every route, generated valid and invalid inputs,
all checks (no server errors, status codes / content types / headers / bodies / SSE events as
documented, invalid data rejected, valid data accepted; see schemathesis.toml for the 422 rule)."""

import subprocess
import sys
from pathlib import Path

import pytest
from servers import start_uvicorn

pytestmark = pytest.mark.slow  # a server
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def fuzzed(checkpoints):
    # short deadlines: a generated request fits in 2 s, or is refused up front (422), or ends (504)
    proc, url = start_uvicorn(checkpoints, "--max-timeout-s", "2", "--max-requests", "256")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_api_conforms_to_its_openapi_schema(fuzzed):
    """300 examples an operation, generated deterministically (the same cases every run)."""
    st = Path(sys.executable).with_name("st")
    done = subprocess.run([str(st), "--config-file", str(HERE / "schemathesis.toml"), "run",
                           fuzzed + "/openapi.json", "--checks", "all", "--max-examples", "300",
                           "--request-timeout", "30", "--generation-deterministic"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "generated" in done.stdout and "failure" not in done.stdout.split("Test cases:")[-1]
