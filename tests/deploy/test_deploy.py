"""What CI can check of the deployment without a Docker engine: compose and Dockerfile lint, the
Kubernetes YAML, agreement of the Dockerfile with the README's install path, and the container's
command line (same arguments and environment, run here) bringing up a ready service."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import yaml
from servers import free_port, spawn, wait_ready

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


pytestmark = pytest.mark.slow  # servers, Ray, training or end-to-end commands


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} not installed (dev extra)"
    return path


def test_compose_file_is_valid():
    out = subprocess.run([_tool("docker-compose"), "-f", str(ROOT / "compose.yaml"), "config", "-q"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"ttcore", "ray-worker", "prometheus", "grafana"} <= set(services)
    assert services["ttcore"]["shm_size"] and services["ray-worker"]["shm_size"]
    assert services["ray-worker"]["environment"]["TTCORE_MODE"] == "worker"
    for name, service in services.items():  # Ray's dashboard (job submission) and GCS: never on all interfaces
        for port in map(str, service.get("ports", [])):
            if port.split(":")[-1] in ("8265", "6379"):
                assert port.startswith("127.0.0.1:"), (name, port)


def test_secrets_come_from_the_environment_and_ray_requires_its_token():
    """Compose, the KubeRay manifest and the image enable Ray's token auth; no secret value is committed:
    the API key and Ray's token come from the environment / an uncommitted .env, or Kubernetes Secrets."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for name in ("ttcore", "ray-worker"):
        env = compose["services"][name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "${RAY_AUTH_TOKEN:-}"
        assert env["TTCORE_API_KEY"] == "${TTCORE_API_KEY:-}"
    assert compose["services"]["prometheus"]["secrets"] == ["api_key"]
    assert compose["secrets"]["api_key"] == {"environment": "TTCORE_METRICS_KEY"}
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["authorization"]["credentials_file"] == "/run/secrets/api_key"
    assert ".env" in (ROOT / ".gitignore").read_text().split() and not (ROOT / ".env").exists()
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text()))
    cluster = next(d for d in docs if d["kind"] == "RayService")["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for pod in pods:
        env = {e["name"]: e for e in pod["template"]["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "ttcore-ray-token"
        assert env["TTCORE_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "ttcore-api-keys"
    assert "RAY_AUTH_MODE=token" in (ROOT / "Dockerfile").read_text()


def test_dockerfile_does_not_expose_ray_internals():
    exposed = [line.split()[1:] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("EXPOSE")]
    assert exposed and not {"6379", "8265"} & {p for ports in exposed for p in ports}, exposed


def test_dockerfile_lints_clean():
    out = subprocess.run([_tool("hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_installs_what_the_readme_command_installs():
    docker = (ROOT / "Dockerfile").read_text()
    dev = (ROOT / "dev.sh").read_text()
    torch_pin = re.search(r"torch==([\d.]+)", dev).group(1)
    assert re.search(r"ARG TORCH_VERSION=" + re.escape(torch_pin), docker)
    torch_line = docker.index('pip install "torch==${TORCH_VERSION}"')
    project_line = docker.index('pip install ".[')
    assert torch_line < project_line  # torch first, pinned, as dev.sh does
    run_extras = re.search(r"run\)\s*\n\s*install ([\w,]+)", dev).group(1)
    assert re.search(r'pip install "\.\[' + re.escape(run_extras) + r'\]"', docker)
    assert "bash dev.sh run" in (ROOT / "README.md").read_text()
    assert re.search(r"^HEALTHCHECK .*?/health", docker, re.M | re.S)
    assert re.search(r"^USER 1000", docker, re.M)


def test_serve_configs_route_twice_the_admitted_requests():
    from service.deployment import INGRESS_MAX_ONGOING, ONGOING_PER_ADMITTED
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text()))
    for config in (yaml.safe_load((ROOT / "deploy" / "serve_config.yaml").read_text()),
                   yaml.safe_load(next(d for d in docs if d["kind"] == "RayService")["spec"]["serveConfigV2"])):
        app = config["applications"][0]
        assert app["deployments"][0]["max_ongoing_requests"] == app["args"]["max_requests"] * ONGOING_PER_ADMITTED
        assert app["deployments"][1]["name"] == "HTTPIngress"
        assert app["deployments"][1]["max_ongoing_requests"] == INGRESS_MAX_ONGOING


def test_kuberay_manifest_runs_the_same_serve_config():
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text()))
    service = next(d for d in docs if d["kind"] == "RayService")
    assert service["apiVersion"] == "ray.io/v1"
    inner = yaml.safe_load(service["spec"]["serveConfigV2"])
    local = yaml.safe_load((ROOT / "deploy" / "serve_config.yaml").read_text())
    a, b = inner["applications"][0], local["applications"][0]
    assert a["import_path"] == b["import_path"] == "service.deployment:build_app"
    assert a["deployments"][0]["name"] == b["deployments"][0]["name"] == "TTCore"
    auto = a["deployments"][0]["autoscaling_config"]
    assert 1 <= auto["min_replicas"] <= auto["max_replicas"]
    workers = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert workers["minReplicas"] <= workers["maxReplicas"]


def test_every_manifest_drains_replicas_within_its_grace_period():
    """Issue 54, graceful drain: a stopped replica lets its requests finish (Serve's graceful_shutdown_*), and
    whatever stops the process waits longer than that: compose's stop_grace_period, and on Kubernetes the
    worker pod's preStop (the pod leaves the endpoints first) plus the drain, within terminationGracePeriodSeconds.
    """
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text()))
    service = next(d for d in docs if d["kind"] == "RayService")
    local = yaml.safe_load((ROOT / "deploy" / "serve_config.yaml").read_text())
    for config in (local, yaml.safe_load(service["spec"]["serveConfigV2"])):
        model = config["applications"][0]["deployments"][0]
        assert model["name"] == "TTCore" and 0 < model["graceful_shutdown_wait_loop_s"] < 10
        drain = model["graceful_shutdown_timeout_s"]
        assert drain >= 30
    pod = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    sleep = int(re.search(r"sleep (\d+)", " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]))
                .group(1))
    assert sleep >= 5 and pod["terminationGracePeriodSeconds"] > sleep + drain
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    grace = next(s["stop_grace_period"] for s in compose["services"].values() if "stop_grace_period" in s)
    assert int(grace.rstrip("s")) > drain


def _container_env(**extra) -> dict:
    """The image's ENV (Dockerfile), with this venv's PATH standing in for /opt/venv."""
    docker = (ROOT / "Dockerfile").read_text()
    block = re.search(r"^ENV PATH=\S+ \\\n((?:\s+\w+=\S+(?: \\)?\n)+)", docker, re.M).group(1)
    env = dict(re.findall(r"(\w+)=(\S+?)(?: \\)?\n", block))
    return {**os.environ, **env, "PATH": f"{BIN}:{os.environ['PATH']}", **extra}


@pytest.fixture(scope="module")
def entrypoint() -> list[str]:
    return re.search(r'^ENTRYPOINT \["sh", "(.+?)"\]', (ROOT / "Dockerfile").read_text(), re.M).group(1)


def test_container_command_embedded_mode_serves(entrypoint, checkpoints):
    port = free_port()
    env = _container_env(TTCORE_MODE="embedded", PORT=str(port), TTCORE_CHECKPOINTS=str(checkpoints))
    proc = spawn(["sh", entrypoint], cwd=ROOT, env=env)
    try:
        wait_ready(f"http://127.0.0.1:{port}", 120, proc)
        r = httpx.post(f"http://127.0.0.1:{port}/generate", json={"num_samples": 1, "steps": 2}, timeout=60)
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_container_command_ray_mode_serves(entrypoint, checkpoints):
    """The image's default command: a Ray head, then `serve run deploy/serve_config.yaml` (port 8000)."""
    temp = tempfile.mkdtemp(prefix="rayd", dir="/tmp")
    token = Path(temp) / "auth" / "token"  # the image's token auth, its token file made by the head
    env = _container_env(TTCORE_CHECKPOINTS=str(checkpoints), RAY_START_ARGS=f"--temp-dir={temp} --num-cpus=2",
                         OMP_NUM_THREADS="1", RAY_AUTH_TOKEN_PATH=str(token))
    env.pop("RAY_AUTH_TOKEN", None)
    assert env["RAY_AUTH_MODE"] == "token"
    proc = spawn(["sh", entrypoint], cwd=ROOT, env=env)
    try:
        wait_ready("http://127.0.0.1:8000", 240, proc)
        models = httpx.get("http://127.0.0.1:8000/models").json()["models"]
        assert len(models) == 4
        assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) == 64
        dashboard = "http://127.0.0.1:8265/api/version"
        assert httpx.get(dashboard, timeout=10).status_code == 401  # no token: no dashboard, no job submission
        ok = httpx.get(dashboard, headers={"authorization": f"Bearer {token.read_text().strip()}"}, timeout=10)
        assert ok.status_code == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
