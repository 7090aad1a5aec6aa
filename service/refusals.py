"""Every way a request is refused before (or instead of) an answer, and the one place where what went wrong
becomes an HTTP status (routes only format answers; each front end writes a ``Refusal`` in its own error
shape: FastAPI's ``detail``, OpenAI's ``error``).

The engine and serving report failures of admitted requests by kind, never by status: ``EngineError.kind``
(and serving's ``Failure.kind``) is ``timeout`` (the request's deadline passed), ``cancelled`` (its client
went away or stopped reading) or ``failed`` (a step raised)."""

from dataclasses import dataclass, field


class ModelNotFound(LookupError):
    """No loaded checkpoint matches; ``available`` lists the loaded ones."""

    def __init__(self, message: str, available: list[dict]):
        super().__init__(message)
        self.available = available


class PromptError(ValueError):
    """The prompt cannot be encoded for the model (unknown tokens, too long)."""


class TooLarge(ValueError):
    """The request can never fit this server's limits; ``field`` names what to lower. ``compute``: refused by
    the compute estimate (which a re-timing may revise), not by memory or the stream limit."""

    def __init__(self, field: str, message: str, compute: bool = False):
        super().__init__(message)
        self.field, self.compute = field, compute


class Unsupported(ValueError):
    """The model or sampler cannot do what the request asks, at any size; ``field`` names the setting."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class Overloaded(RuntimeError):
    """The server's queue is full; ``retry_after_s`` says when to try again."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ScoreInputError(ValueError):
    """A sequence or the template cannot be scored; ``loc`` names it (e.g. ``["sequences", 3]``)."""

    def __init__(self, loc: list, message: str):
        super().__init__(message)
        self.loc = loc


class ScoreTimeout(TimeoutError):
    """A /score request's deadline passed between its pieces."""


class ScoreCancelled(Exception):
    """A /score request's client went away."""


REFUSED = (ModelNotFound, PromptError, TooLarge, Unsupported, Overloaded, ScoreInputError, ScoreTimeout,
           ScoreCancelled)
FAILURE_STATUS = {"timeout": 504, "cancelled": 499, "failed": 500,  # 499: nginx's "client closed request"
                  "shutdown": 503}


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
