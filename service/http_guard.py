"""Embedded mode's HTTP connection guards (uvicorn's h11 protocol and its access log), for a server
that faces strangers:

- ``guarded_h11(read_timeout_s)``: a request's headers and body must arrive within ``read_timeout_s``
  of the connection opening (or of the previous answer on a kept-alive connection), else the connection
  is closed. uvicorn arms no timer before the first request and disarms its keep-alive timer at the
  first byte of the next, so a client sending half a header held a connection (and its memory) for as
  long as it liked (the review held 16 for 112 s). The answer itself (a stream, a long generation) is
  not limited here: the request's deadline (``timeout_s``) is.
- request heads that parsers read differently are refused (400, then the connection closes) before h11
  reads them: a bare LF where CRLF ends a line (h11 accepts it; a proxy in front may not, and splits the
  request differently), an obs-fold continuation line (RFC 9112 Sec. 5.2: a server must reject it or
  replace it; h11 joined it), and Content-Length beside Transfer-Encoding (RFC 9112 Sec. 6.1: the
  classic request-smuggling pair; h11 took the chunked body). ``unambiguous_head`` decides.
- ``access_log_config()``: uvicorn's logging with the query string cut from access-log lines, so that
  a secret a client put in a URL (``?api_key=...``: the service never reads keys from URLs) is not
  written to the log.
"""

import copy
import logging

from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_READ_TIMEOUT_S = 15.0
MAX_HEAD_BYTES = 64 * 1024  # h11's own limit on a request head (its max_incomplete_event_size default is 16 KiB)


def unambiguous_head(head: bytes) -> str | None:
    """Why a request head (the bytes up to and including its blank line) must be refused, or None: a bare LF,
    an obs-fold line, or both Content-Length and Transfer-Encoding."""
    if b"\n" in head.replace(b"\r\n", b""):
        return "a line ends in a bare LF (HTTP/1.1 lines end in CRLF)"
    lines = head.split(b"\r\n")
    if any(line[:1] in (b" ", b"\t") for line in lines[1:]):
        return "a header line is folded (obs-fold, RFC 9112 Sec. 5.2)"
    names = {line.split(b":", 1)[0].strip().lower() for line in lines[1:] if b":" in line}
    if b"content-length" in names and b"transfer-encoding" in names:
        return "Content-Length and Transfer-Encoding together (RFC 9112 Sec. 6.1)"
    return None


class _ReadDeadline(H11Protocol):
    read_timeout_s = DEFAULT_READ_TIMEOUT_S

    def connection_made(self, transport):
        super().connection_made(transport)
        self._head = b""  # the current request's head, until its blank line (None once checked)
        self._arm_read_deadline()

    def data_received(self, data: bytes) -> None:
        if self._head is not None:  # the head is checked whole before h11 may act on its end
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            head = self._head if end < 0 else self._head[:end + 4]
            why = unambiguous_head(head if end >= 0 else head + b"\r\n\r\n") if b"\n" in head else None
            if why is not None:
                return self._refuse(why)
            if end >= 0 or len(self._head) > MAX_HEAD_BYTES:  # checked (or h11's limit answers it)
                self._head = None
        super().data_received(data)

    def _refuse(self, why: str) -> None:
        self.logger.info("refusing a request head: %s", why)
        body = f'{{"detail": "bad request: {why}"}}'.encode()
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._head = b""  # the next request's head is checked the same way
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
