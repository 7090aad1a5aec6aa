"""The ttcore HTTP service: schema (pydantic), engine (continuous batching), transport (FastAPI)."""

import os
from pathlib import Path

__all__ = ["default_checkpoints"]


def default_checkpoints() -> str:
    """$TTCORE_CHECKPOINTS, else the repository's bundled ``checkpoints/``."""
    return os.environ.get("TTCORE_CHECKPOINTS") or str(Path(__file__).resolve().parent.parent / "checkpoints")
