"""Real servers for the service tests: uvicorn in a subprocess and a local Ray Serve application
(started once per test session)."""

import os
import shutil
import tempfile

import pytest
from servers import free_port, uvicorn_server, wait_ready


@pytest.fixture(scope="session")
def server(checkpoints):
    with uvicorn_server(checkpoints) as url:
        yield url


@pytest.fixture(scope="session")
def ray_server(checkpoints):
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # a loaded 2-core machine can take longer than Serve's 5 s to start the HTTP proxy, which Serve then kills
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    import ray
    from ray import serve

    from service.deployment import build_app

    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app({"checkpoints": str(checkpoints), "threads": 1, "precision": "bf16"})
        serve.run(app, name="ttcore", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
