"""Ray Serve: the same FastAPI app as embedded mode, one engine per model replica (``TTCore``), behind a
thin HTTP ingress (``HTTPIngress``, ``service.ingress``) that answers for a replica that fails.

    serve run deploy/serve_config.yaml          # import_path: service.deployment:build_app

``build_app(args)`` is the typed application builder Ray Serve calls with the config's ``args``.
The ASGI app is built on each replica (the builder below runs there), so replicas load the
checkpoints themselves; the project must be importable by them (installed, or PYTHONPATH in the
runtime env).
"""

from pathlib import Path

from pydantic import BaseModel, Field
from ray import serve
from ray.serve import Application

from . import default_checkpoints

# Ray may route up to this many times a replica's admitted requests to it, so a full replica answers
# overload itself (503 with Retry-After) instead of Ray queueing without bound; the serve configs'
# max_ongoing_requests is max_requests times this (a test checks both files)
ONGOING_PER_ADMITTED = 2
INGRESS_MAX_ONGOING = 1024  # the relay holds a request's stream and little else; admission is the replicas'


class AppArgs(BaseModel):
    checkpoints: str = Field(default_factory=default_checkpoints,
                             description="Directory of checkpoint directories ($TTCORE_CHECKPOINTS or the bundled)")
    device: str = "cpu"
    precision: str = Field("auto", pattern="^(auto|fp32|bf16)$",
                           description="auto: bf16 where bf16 matmuls are native, else fp32")
    max_batch_samples: int = Field(256, ge=1)
    max_requests: int = Field(64, ge=1, description="Admitted requests per replica before 503")
    threads: int = Field(0, ge=0, description="torch threads per replica (0: torch's default)")
    api_key_file: str | None = Field(None, description="API keys, one per line, read on each replica; keys also "
                                                        "come from the replicas' $TTCORE_API_KEY (runtime_env)")
    public_metrics: bool = False
    public_docs: bool = False
    max_body_bytes: int = Field(1 << 20, ge=1024)
    cors_origins: list[str] = Field(default_factory=list)
    key_max_concurrency: int = Field(16, ge=0, description="with API keys: requests in flight per key (per replica)")
    key_rate_per_minute: int = Field(600, ge=0, description="with API keys: requests per minute per key (per replica)")
    memory_budget_mb: int = Field(2048, ge=64, description="the most one step of one request may hold")
    max_timeout_s: float = Field(600.0, gt=0, description="the longest deadline of a request (504 past it)")
    stall_s: float = Field(120.0, gt=0, description="/health is 503 when a worker is on one step longer")


def _asgi_builder(args: AppArgs):
    def build():
        import os

        from .app import create_app
        from .security import SecurityConfig, load_api_keys
        from .serving import build_serving

        keys = load_api_keys(args.api_key_file, os.environ.get("TTCORE_API_KEY"))  # on the replica, not the driver
        security = SecurityConfig(keys, args.max_body_bytes, args.public_metrics, args.public_docs,
                                  tuple(args.cors_origins), args.key_max_concurrency, args.key_rate_per_minute)
        serving = build_serving(args.checkpoints, device=args.device, precision=args.precision,
                                max_batch_samples=args.max_batch_samples, max_requests=args.max_requests,
                                threads=args.threads or None, memory_budget_mb=args.memory_budget_mb,
                                max_timeout_s=args.max_timeout_s, stall_s=args.stall_s)
        return create_app(serving, security)

    return build


class ModelServer:
    """A model replica: the whole app of embedded mode (schema, security, engine, SSE framing), answering
    each HTTP request the ingress relays as the stream of its ASGI messages."""

    def __init__(self, args: AppArgs):
        self.app = _asgi_builder(args)()

    async def http(self, scope: dict, body: bytes):
        from .ingress import asgi_messages

        async for message in asgi_messages(self.app, scope, body):
            yield message


class HTTPIngress:
    """The HTTP ingress (``service.ingress``): relays every request to a ``ModelServer`` replica and frames
    the answer when that replica fails (503, or an ``error`` event mid-stream)."""

    def __init__(self, model, max_body_bytes: int):
        self.model = model.options(stream=True)
        self.max_body_bytes = max_body_bytes

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        from .ingress import read_body, relay, replica_scope

        body = await read_body(request, self.max_body_bytes)
        if body is None:
            return JSONResponse({"detail": f"request body larger than {self.max_body_bytes} bytes"}, status_code=413)
        return await relay(_replica_messages(self.model.http.remote(replica_scope(request), body)), request.url.path)


async def _replica_messages(response):
    """A streaming handle's items, with Ray's failures (the replica died, the queue is full) as ReplicaFailed;
    a cancelled request (the client went away) stays cancelled."""
    import asyncio

    from ray.serve.exceptions import BackPressureError, RequestCancelledError

    from .ingress import ReplicaFailed

    try:
        async for message in response:
            yield message
    except (asyncio.CancelledError, RequestCancelledError):
        raise
    except BackPressureError as e:
        raise ReplicaFailed("BackPressureError", "overloaded: the model replicas' queue is full; retry") from e
    except Exception as e:  # RayActorError, ActorDiedError, ActorUnavailableError, DeploymentUnavailableError
        raise ReplicaFailed(type(e).__name__) from e


def build_app(args: dict | AppArgs | None = None) -> Application:
    """Typed builder for ``serve run`` / ``serve.run``: ``HTTPIngress`` in front of ``TTCore`` (the model
    replicas); deployment options (replicas, autoscaling, max_ongoing_requests) come from the serve config's
    ``deployments`` section. A full model deployment queues at most ``max_requests`` requests at the ingress,
    then answers 503."""
    args = AppArgs.model_validate(args or {})
    args.checkpoints = str(Path(args.checkpoints).resolve())  # replicas may run in another directory
    model = serve.deployment(ModelServer, name="TTCore", max_ongoing_requests=args.max_requests * ONGOING_PER_ADMITTED,
                             max_queued_requests=args.max_requests)
    ingress = serve.deployment(HTTPIngress, name="HTTPIngress", max_ongoing_requests=INGRESS_MAX_ONGOING)
    return ingress.bind(model.bind(args), args.max_body_bytes)


def replica_pids(deployment: str = "TTCore") -> list[int]:
    """Process ids of this machine's Serve replicas of ``deployment`` (for soak figures and fault tests)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "ServeReplica" in cmd and cmd.rstrip("\x00").split(":")[-1] == deployment:
                pids.append(int(p.name))
    return pids


def main():
    """A local Ray Serve application on this machine (a fresh Ray cluster, stopped with this process):

        python -m service.deployment --port 8000 --args '{"checkpoints": "checkpoints", "threads": 1}'
    """
    import argparse
    import json
    import signal
    import sys
    import time

    import ray

    ap = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--args", default="{}", help="the application's args (AppArgs) as JSON")
    opts = ap.parse_args()

    def stop(*_):
        serve.shutdown()
        ray.shutdown()  # the local cluster this process started goes with it
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    serve.start(http_options={"host": opts.host, "port": opts.port})
    serve.run(build_app(json.loads(opts.args)), name="ttcore", route_prefix="/")
    print(f"serving on http://{opts.host}:{opts.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
