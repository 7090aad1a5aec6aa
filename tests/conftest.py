from pathlib import Path

import pytest
from servers import make_checkpoints  # importable: pyproject's pytest pythonpath


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Path:
    """Tiny trained checkpoints (base, TT r=2, CP r=3) plus a broken one, shared by the server tests."""
    return make_checkpoints(tmp_path_factory.mktemp("checkpoints"))
