"""The one place where what went wrong becomes an HTTP status (routes only format answers).

The engine and serving report failures by kind, never by status: ``EngineError.kind`` is ``timeout``
(the request's deadline passed), ``cancelled`` (its client went away or stopped reading) or ``failed`` (a
step raised)."""

FAILURE_STATUS = {"timeout": 504, "cancelled": 499, "failed": 500}  # 499: nginx's "client closed request"


def failure_status(kind: str) -> int:
    """The status of a non-streamed answer that ended with a failure of ``kind`` (unknown kinds: 500)."""
    return FAILURE_STATUS.get(kind, 500)
