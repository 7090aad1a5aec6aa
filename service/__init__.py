"""The ttcore HTTP service: schema (pydantic), engine (continuous batching), transport (FastAPI)."""

__all__ = ["app", "engine", "metrics", "schema"]
