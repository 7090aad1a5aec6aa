"""Embedded mode's HTTP connection guards (uvicorn's h11 protocol and its access log), for a server
that faces strangers:

- ``guarded_h11(read_timeout_s)``: a request's headers and body must arrive within ``read_timeout_s``
  of the connection opening (or of the previous answer on a kept-alive connection), else the connection
  is closed. uvicorn arms no timer before the first request and disarms its keep-alive timer at the
  first byte of the next, so a client sending half a header held a connection (and its memory) for as
  long as it liked (the review held 16 for 112 s). The answer itself (a stream, a long generation) is
  not limited here: the request's deadline (``timeout_s``) is.
- ``access_log_config()``: uvicorn's logging with the query string cut from access-log lines, so that
  a secret a client put in a URL (``?api_key=...``: the service never reads keys from URLs) is not
  written to the log.
"""

import copy
import logging

from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_READ_TIMEOUT_S = 15.0


class _ReadDeadline(H11Protocol):
    read_timeout_s = DEFAULT_READ_TIMEOUT_S

    def connection_made(self, transport):
        super().connection_made(transport)
        self._arm_read_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_read_deadline()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc):
        self._disarm_read_deadline()
        super().connection_lost(exc)

    def _arm_read_deadline(self) -> None:
        self._disarm_read_deadline()
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_deadline_passed,
                                                   self.server_state.total_requests)

    def _disarm_read_deadline(self) -> None:
        timer = getattr(self, "_read_deadline", None)
        if timer is not None:
            timer.cancel()
        self._read_deadline = None

    def _read_deadline_passed(self, answered: int) -> None:
        cycle = self.cycle
        waiting = cycle is None or cycle.response_complete  # no request's headers yet (first, or next one)
        reading_body = cycle is not None and not cycle.response_complete and cycle.more_body \
            and not cycle.response_started
        if (waiting or reading_body) and not self.transport.is_closing():
            self.logger.info("closing a connection whose request did not arrive within %g s", self.read_timeout_s)
            self.transport.close()


def guarded_h11(read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a read deadline of ``read_timeout_s`` per request (pass as ``http=``)."""
    return type("GuardedH11Protocol", (_ReadDeadline,), {"read_timeout_s": float(read_timeout_s)})


class StripQuery(logging.Filter):
    """Cut the query string from uvicorn access-log records (their third argument is the full path)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?[query not logged]", *args[3:])
        return True


def access_log_config() -> dict:
    """uvicorn's default logging configuration with ``StripQuery`` on the access log."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["strip_query"] = {"()": f"{__name__}.StripQuery"}
    config["handlers"]["access"]["filters"] = ["strip_query"]
    return config
