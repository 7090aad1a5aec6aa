"""`docker compose up` with a real Docker engine: the images built here without a registry
(``deploy/local-images.sh``), the stack started, a request served through Ray Serve with an API key, Prometheus
scraping the service, the head and every scaled worker, and a multi-node Ray cluster (``--scale ray-worker=2``).

Skipped where no Docker engine answers (``docker info``), e.g. a CI machine without ``docker.io``. On a machine
like the development one: ``apt-get install docker.io debootstrap``, start ``dockerd``, then this test (the first
build takes a few minutes; later ones reuse the images' layers). The CA bundle pip must trust (``PIP_CERT``) and a
local torch CPU wheel (``/opt/wheels``) are taken from the environment when present; nothing of them is committed.
"""

import glob
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from servers import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROJECT = "ttcore-compose-test"

pytestmark = pytest.mark.slow


def _docker() -> str | None:
    """A docker client that builds with BuildKit (buildx, or Debian's 20.10 client), when an engine answers."""
    candidates = [c for c in (shutil.which("docker"), "/usr/bin/docker") if c and os.path.exists(c)]
    for client in candidates:
        if subprocess.run([client, "info"], capture_output=True).returncode != 0:
            continue
        if subprocess.run([client, "buildx", "version"], capture_output=True).returncode == 0:
            return client
        if client == "/usr/bin/docker":  # Debian's docker.io: BuildKit built in
            return client
    return None


DOCKER = _docker()


def _compose(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "docker-compose"), "-p", PROJECT, "-f", str(ROOT / "compose.yaml"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _wait(check, seconds: float, what: str):
    deadline = time.time() + seconds
    last = None
    while time.time() < deadline:
        try:
            got = check()
            if got:
                return got
        except (httpx.HTTPError, ValueError, KeyError) as e:
            last = e
        time.sleep(2)
    raise AssertionError(f"{what} within {seconds:.0f} s (last: {last!r})")


def _pip_configured_cert() -> str | None:
    """The CA bundle pip trusts on this machine: its configured ``global.cert``, else the system's bundle (which
    holds a TLS-intercepting proxy's CA where the machine trusts one), if either exists."""
    done = subprocess.run([str(BIN / "python"), "-m", "pip", "config", "get", "global.cert"], capture_output=True,
                          text=True)
    for path in (done.stdout.strip() if done.returncode == 0 else "", "/etc/ssl/certs/ca-certificates.crt"):
        if path and os.path.isfile(path):
            return path
    return None


@pytest.mark.skipif(DOCKER is None, reason="no Docker engine answers `docker info` here")
@pytest.mark.timeout(1500)  # builds the image: pip inside the build is the slow part on a fresh engine
def test_docker_compose_up_serves_scrapes_and_scales():
    build_env = dict(os.environ, DOCKER=DOCKER)
    ca = os.environ.get("PIP_CERT") or _pip_configured_cert()
    if ca:
        build_env["PIP_CA"] = ca
    wheels = sorted(glob.glob("/opt/wheels/torch-2.13.0+cpu-cp311-*.whl"))
    if wheels:
        build_env["TORCH_WHEEL"] = wheels[0]
    t0 = time.time()
    built = subprocess.run(["sh", str(ROOT / "deploy" / "local-images.sh")], cwd=ROOT, env=build_env,
                           capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    build_s = time.time() - t0
    replaced = subprocess.run([DOCKER, "images", "-q", "--filter", "dangling=true", "--filter",
                               "label=org.opencontainers.image.title=ttcore"], capture_output=True, text=True)
    assert replaced.returncode == 0 and replaced.stdout.strip() == "", replaced.stdout  # no earlier build kept

    key = secrets.token_hex(16)
    api, prom = free_port(), free_port()
    env = dict(os.environ, PYTHON_IMAGE="ttcore-python:3.11-bookworm", PROMETHEUS_IMAGE="ttcore-prometheus:local",
               TTCORE_PORT=str(api), PROMETHEUS_PORT=str(prom), TTCORE_API_KEY=key, TTCORE_METRICS_KEY=key)
    _compose(env, "down", "-v")
    try:
        t0 = time.time()
        up = _compose(env, "up", "-d", "--no-build", "ttcore", "prometheus")
        assert up.returncode == 0, up.stderr[-3000:]
        url = f"http://127.0.0.1:{api}"
        _wait(lambda: httpx.get(url + "/health", timeout=5).status_code == 200, 300, "the service is healthy")
        ready_s = time.time() - t0
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.post(url + "/generate", json={"num_samples": 1}, timeout=30).status_code == 401
        t0 = time.time()
        r = httpx.post(url + "/generate", headers=auth, timeout=120,
                       json={"model": "qm9", "num_samples": 4, "steps": 8, "seed": 0})
        first_s = time.time() - t0
        assert r.status_code == 200, r.text
        samples = r.json()["samples"]
        assert len(samples) == 4 and all(s["valid"] is not None for s in samples), samples  # RDKit loads

        def targets():
            d = httpx.get(f"http://127.0.0.1:{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in d}

        def service_and_head_up():
            t = targets()
            return t.get(("ttcore", "ttcore:8000")) == "up" and t.get(("ray-head", "ttcore:8080")) == "up"
        _wait(service_and_head_up, 90, "Prometheus scrapes the service (with the API key) and the Ray head")

        scaled = _compose(env, "up", "-d", "--no-build", "--scale", "ray-worker=2", "ray-worker")
        assert scaled.returncode == 0, scaled.stderr[-3000:]

        def nodes():
            out = subprocess.run([DOCKER, "exec", f"{PROJECT}-ttcore-1", "ray", "status"], capture_output=True,
                                 text=True, timeout=60).stdout
            active = out.split("Active:")[1].split("Pending:")[0] if "Active:" in out else ""
            return active.count("node_") == 3
        _wait(nodes, 180, "two workers join the head with Ray's token (3 active nodes)")
        _wait(lambda: sum(1 for (job, _), h in targets().items() if job == "ray-workers" and h == "up") == 2, 120,
              "Prometheus finds and scrapes both workers")
        r = httpx.post(url + "/generate", headers=auth, timeout=120,
                       json={"model": "qm9", "num_samples": 2, "steps": 4, "seed": 1})
        assert r.status_code == 200, r.text
        print(f"\nimages built in {build_s:.0f} s; healthy {ready_s:.0f} s after `up`; first request {first_s:.2f} s")
    finally:
        down = _compose(env, "down", "-v")
        # BuildKit keeps every build's layers as cache (the project's virtual environment, ~2.5 GB, again at each
        # code change): on a machine that runs this test at every change (CI) they grow without bound; a cap keeps
        # the last build's for the next to reuse
        subprocess.run([DOCKER, "builder", "prune", "-f", "--keep-storage", "6GB"], capture_output=True, timeout=600)
        assert down.returncode == 0, down.stderr[-2000:]
