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


def start(argv: list, *, cwd, env: dict | None = None, timeout: float = 300, poll: float = 0.2,
          **popen) -> tuple[subprocess.Popen, str]:
    """Run ``argv`` (a server command that takes ``--port``) on a free port and wait until its ``/ready`` answers
    200 -> (process, url). Its stderr goes to a temporary file, never a pipe (a pipe nobody reads fills at 64 KB
    and blocks the server); a server that exits or is not ready in ``timeout`` s stops the benchmark with that
    file's tail."""
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
        if proc.poll() is not None or time.time() > deadline:
            os.killpg(proc.pid, 9) if popen.get("start_new_session") else proc.kill()  # a Ray driver: its group
            log.seek(0)
            raise SystemExit(f"{' '.join(map(str, argv[:4]))} did not get ready: "
                             f"{log.read().decode(errors='replace')[-2000:]}")
        time.sleep(poll)
