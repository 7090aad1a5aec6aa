"""The benchmarks' servers: a free loopback port, and a server command started on it and waited for until ready."""

import os
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# a port free when chosen can be taken before the server binds it (another test's server, one of Ray's workers)
BIND_FAILURES = ("Failed to bind to address", "address already in use", "error while attempting to bind")


def start(argv: list, *, cwd, env: dict | None = None, timeout: float = 300, poll: float = 0.2, attempts: int = 3,
          **popen) -> tuple[subprocess.Popen, str]:
    """Run ``argv`` (a server command that takes ``--port``) on a free port and wait until its ``/ready`` answers
    200 -> (process, url). Its stderr goes to a temporary file, never a pipe (a pipe nobody reads fills at 64 KB
    and blocks the server); a server that exits or is not ready in ``timeout`` s stops the benchmark with that
    file's tail, except one that could not bind its port (taken since it was chosen): that one is started again on
    another, ``attempts`` times in all."""
    for attempt in range(attempts):
        try:
            return _start_once(argv, cwd, env, timeout, poll, popen, last=attempt == attempts - 1)
        except PortTaken:
            continue


class PortTaken(Exception):
    """The server could not bind the port chosen for it."""


def _start_once(argv, cwd, env, timeout, poll, popen, last: bool) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([str(a) for a in argv] + ["--port", str(port)], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=log, **popen)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        exited = proc.poll() is not None  # before reading the log: an exited server has written all of it
        written = os.pread(log.fileno(), os.fstat(log.fileno()).st_size, 0)  # the server's offset left alone
        bind_failed = any(f.encode() in written for f in BIND_FAILURES)
        if bind_failed or exited or time.time() > deadline:
            os.killpg(proc.pid, 9) if popen.get("start_new_session") else proc.kill()  # a Ray driver: its group
            if bind_failed and not last:
                raise PortTaken(port)
            log.seek(0)
            raise SystemExit(f"{' '.join(map(str, argv[:4]))} did not get ready: "
                             f"{log.read().decode(errors='replace')[-2000:]}")
        time.sleep(poll)
