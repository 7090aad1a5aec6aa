"""The one place where what went wrong becomes an HTTP status (routes only format answers).

The engine and serving report failures by kind, never by status: ``EngineError.kind`` (and serving's
``Failure.kind``) is ``timeout`` (the request's deadline passed), ``cancelled`` (its client went away or
stopped reading) or ``failed`` (a step raised). A request refused before it runs raises one of the
exceptions ``refusal`` maps; each front end formats the ``Refusal`` in its own error shape."""

from dataclasses import dataclass, field

from .admission import TooLarge
from .engine import Overloaded
from .registry import ModelNotFound, PromptError
from .serving import ScoreCancelled, ScoreInputError, ScoreTimeout, Unsupported

FAILURE_STATUS = {"timeout": 504, "cancelled": 499, "failed": 500}  # 499: nginx's "client closed request"


def failure_status(kind: str) -> int:
    """The status of a non-streamed answer that ended with a failure of ``kind`` (unknown kinds: 500)."""
    return FAILURE_STATUS.get(kind, 500)


@dataclass(frozen=True)
class Refusal:
    """Why a request was not run: its status, a message safe to show, the request field it names (``loc``,
    e.g. ``("num_samples",)`` or ``("sequences", 3)``; empty when none), the checkpoints available (404) and
    response headers (Retry-After for 503)."""
    status: int
    message: str
    loc: tuple = ()
    available: list | None = None
    headers: dict = field(default_factory=dict)
    code: str | None = None


REFUSED = (ModelNotFound, PromptError, TooLarge, Unsupported, Overloaded, ScoreInputError, ScoreTimeout,
           ScoreCancelled)


def refusal(e: Exception) -> Refusal:
    """The ``Refusal`` for one of ``REFUSED``."""
    if isinstance(e, ModelNotFound):
        return Refusal(404, str(e), ("model",), available=e.available, code="model_not_found")
    if isinstance(e, PromptError):
        return Refusal(422, str(e), ("prompt",))
    if isinstance(e, (TooLarge, Unsupported)):
        return Refusal(422, str(e), (e.field,))
    if isinstance(e, ScoreInputError):
        return Refusal(422, str(e), tuple(e.loc))
    if isinstance(e, Overloaded):
        return Refusal(503, str(e), headers={"Retry-After": str(e.retry_after_s)}, code="overloaded")
    if isinstance(e, ScoreTimeout):
        return Refusal(failure_status("timeout"), str(e), code="timeout")
    if isinstance(e, ScoreCancelled):
        return Refusal(failure_status("cancelled"), str(e), code="cancelled")
    raise TypeError(f"not a refusal: {type(e).__name__}")
