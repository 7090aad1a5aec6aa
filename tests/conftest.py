import os
from pathlib import Path

import pytest
import torch
from servers import make_checkpoints  # importable: pyproject's pytest pythonpath

if os.environ.get("PYTEST_XDIST_WORKER"):  # dev.sh's workers share the cores: one intra-op thread each, or
    # their thread pools oversubscribe the machine (a calibration then timed a text step at 500 s, not 5); the
    # commands a test starts (benchmarks, recipes, servers) inherit one OpenMP thread each for the same reason
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Path:
    """Tiny trained checkpoints (base, TT r=2, CP r=3) plus a broken one, shared by the server tests."""
    return make_checkpoints(tmp_path_factory.mktemp("checkpoints"))


ROOT = Path(__file__).resolve().parents[1]


def _tree_state() -> str | None:
    """``git status --porcelain`` of the repository (untracked files included, ignored ones not), or None
    outside a git checkout."""
    import subprocess

    try:
        done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def pytest_sessionstart(session):
    session.config._tree_before = _tree_state()


def pytest_sessionfinish(session, exitstatus):
    """A test must not change the repository (the review found the suite rewriting a tracked picture and
    leaving folders in the repo root): the run fails when the working tree differs from how it started."""
    before = getattr(session.config, "_tree_before", None)
    after = _tree_state()
    if before is None or after is None or before == after:
        return
    changed = sorted(set(after.splitlines()) - set(before.splitlines()))  # new entries: a file newly written
    if not changed:
        return
    session.config.get_terminal_writer().line(
        "the test run changed the repository (write under tmp_path or an ignored folder):\n  " + "\n  ".join(changed),
        red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
