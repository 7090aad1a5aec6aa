"""The error answers as /openapi.json describes them. A route's ``responses`` entry without a model documents a
status and no body, so a client generated from the document could not read the errors this server sends; here
each documented error status gets the body's schema: ``{"detail": [{loc, msg, type}]}`` for a native 422,
``{"detail": "..."}`` for the others, OpenAI's ``{"error": {...}}`` under ``/v1``. schemathesis checks every
answer it provokes against them (``tests/service/test_fuzz.py``)."""

from pydantic import BaseModel, ConfigDict, Field


class ErrorAnswer(BaseModel):
    """A refusal or failure of a native route (a 404 adds the checkpoints ``available``)."""
    model_config = ConfigDict(extra="allow")
    detail: str = Field(description="What was refused and why, in words")


class FieldError(BaseModel):
    loc: list[str | int] = Field(description="Where: `body` or `query`, then the field's path")
    msg: str = Field(description="The rule the value breaks (for a limit, the largest value that fits)")
    type: str


class InvalidAnswer(BaseModel):
    """A native 422: the fields refused, as FastAPI's validation errors (never the input itself)."""
    detail: list[FieldError]


class OpenAIError(BaseModel):
    message: str
    type: str = Field(description="`invalid_request_error` or `server_error`")
    param: str | None = Field(description="The request's field at fault, when one is")
    code: str | None = Field(description="e.g. `model_not_found`, `context_length_exceeded`")


class OpenAIErrorAnswer(BaseModel):
    """An error under ``/v1``, in OpenAI's shape."""
    error: OpenAIError


class StatusAnswer(BaseModel):
    """/health and /ready: ``status`` in words, and what explains it (/ready adds ``in_flight`` or ``refused``)."""
    model_config = ConfigDict(extra="allow")
    status: str
    detail: str | None = None


def native(responses: dict[int, dict | str]) -> dict[int, dict]:
    """``responses`` for a native route: each error status (a description) with its body's schema; a success's
    entry (a dict) is kept as written."""
    return {code: entry if isinstance(entry, dict) else
            {"description": entry, "model": InvalidAnswer if code == 422 else ErrorAnswer}
            for code, entry in responses.items()}


def openai(responses: dict[int, dict | str]) -> dict[int, dict]:
    """``responses`` for a ``/v1`` route: each error status with OpenAI's error object."""
    return {code: entry if isinstance(entry, dict) else {"description": entry, "model": OpenAIErrorAnswer}
            for code, entry in responses.items()}
