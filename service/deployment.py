"""Ray Serve: the same FastAPI app as embedded mode, one engine per model replica (``TTCore``), behind a
thin HTTP ingress (``HTTPIngress``, ``service.ingress``) that answers for a replica that fails.

    serve run deploy/serve_config.yaml          # import_path: service.deployment:build_app

``build_app(args)`` is the typed application builder Ray Serve calls with the config's ``args``.
The ASGI app is built on each replica (the builder below runs there), so replicas load the
checkpoints themselves; the project must be importable by them (installed, or PYTHONPATH in the
runtime env).
"""

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import ray
from ray import serve
from ray.serve import Application

from .config import ServiceArgs

log = logging.getLogger("ttcore.service")

# Ray may route up to this many times a replica's admitted requests to it, so a full replica answers
# overload itself (503 with Retry-After) instead of Ray queueing without bound; the serve configs'
# max_ongoing_requests is max_requests times this (a test checks both files)
ONGOING_PER_ADMITTED = 2
INGRESS_MAX_ONGOING = 1024  # the relay holds a request's stream and little else; admission is the replicas'


AppArgs = ServiceArgs  # the application's args: every option of the service, typed once (service.config)

DRAIN_ACTOR, DRAIN_NAMESPACE = "ttcore-drain", "ttcore"  # the drain's shared state (``DrainState``)
FIRST_REPORT_WAIT_S = 5.0  # a replica's first request waits at most this for its drain watch's first report
DRAIN_FLUSH_S = 1.0  # after the last request in flight finished: its answer's bytes still travel to the client
DRAIN_POLL_S = 0.1  # how often a replica reports its requests in flight and reads whether to drain
DRAIN_REPORT_MAX_AGE_S = 2.0  # a replica silent longer than this (gone) no longer counts as in flight


@ray.remote(num_cpus=0)
class DrainState:
    """What ``python -m service.deployment`` and its replicas share for a graceful drain: whether to drain, and
    each replica's requests in flight as it last reported them (a replica reports every ``DRAIN_POLL_S``)."""

    def __init__(self):
        self.draining, self.reports = False, {}

    def start(self) -> None:
        self.draining = True

    def report(self, replica: str, in_flight: int) -> bool:
        """A replica's requests in flight now. -> whether it is to drain."""
        self.reports[replica] = (in_flight, time.monotonic())
        return self.draining

    def in_flight(self) -> int:
        """Requests in flight over the replicas that reported within ``DRAIN_REPORT_MAX_AGE_S``."""
        now = time.monotonic()
        return sum(n for n, at in self.reports.values() if now - at <= DRAIN_REPORT_MAX_AGE_S)


async def _watch_drain(engine, replica: str, first: asyncio.Event | None = None) -> None:
    """A replica's side of the drain: report the engine's requests in flight to ``DrainState`` and set the
    engine draining (``/ready`` 503, new requests 503 with Retry-After, those in flight finish) once it says
    so. Without a ``DrainState`` (a cluster not started by ``main``: KubeRay, ``serve run``) Serve's own
    graceful shutdown drains a stopped replica."""
    state = None
    try:
        while True:
            try:
                state = state or ray.get_actor(DRAIN_ACTOR, namespace=DRAIN_NAMESPACE)
                if await state.report.remote(replica, engine.in_flight):
                    engine.draining = True
            except ValueError:  # no DrainState: not started by ``main`` (it makes one before the app): nothing to do
                return
            except Exception as e:  # noqa: BLE001 - the drain's bookkeeping never fails a request
                log.warning("drain state unreachable (%s: %s)", type(e).__name__, e)
                state = None
            if first is not None:
                first.set()
            await asyncio.sleep(DRAIN_POLL_S)
    finally:
        if first is not None:
            first.set()


def _asgi_builder(args: AppArgs):
    def build():
        import os

        from .app import create_app
        from .security import SecurityConfig, load_api_keys
        from .serving import build_serving

        keys = load_api_keys(args.api_key_file, os.environ.get("TTCORE_API_KEY"))  # on the replica, not the driver
        return create_app(build_serving(args), SecurityConfig.from_args(args, keys))

    return build


class ModelServer:
    """A model replica: the whole app of embedded mode (schema, security, engine, SSE framing), answering
    each HTTP request the ingress relays as the stream of its ASGI messages."""

    def __init__(self, args: AppArgs):
        self.app = _asgi_builder(args)()
        self._drain_watch: asyncio.Task | None = None  # started with the first request, on the replica's loop

    async def http(self, scope: dict, body: bytes):
        from .ingress import asgi_messages

        if self._drain_watch is None:  # the first request waits for the first report: a replica that has served
            # nothing yet must not answer /ready 200 (or admit a request) while the drain has begun
            replica, first = serve.get_replica_context().replica_id.unique_id, asyncio.Event()
            self._drain_watch = asyncio.get_running_loop().create_task(
                _watch_drain(self.app.state.serving.engine, replica, first))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(first.wait(), FIRST_REPORT_WAIT_S)
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

    SIGTERM / SIGINT drain it first: every replica's ``/ready`` answers 503 (draining) and new requests 503 with
    Retry-After, the requests in flight finish (at most ``--drain-timeout-s``), then Serve and Ray stop; a
    second signal stops them at once.
    """
    import argparse
    import json
    import signal
    import sys

    ap = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--args", default="{}", help="the application's args (AppArgs) as JSON")
    ap.add_argument("--drain-timeout-s", type=float, default=30.0,
                    help="on SIGTERM, how long requests in flight may take to finish before the replicas stop")
    opts = ap.parse_args()
    draining = []

    def stop(*_):
        if not draining:  # the first signal drains; a second one (or a drain of 0 s) stops at once
            draining.append(time.monotonic())
            ray.get(drain.start.remote())
            time.sleep(4 * DRAIN_POLL_S)  # every replica has read it and reported since
            while ray.get(drain.in_flight.remote()) and time.monotonic() - draining[0] < opts.drain_timeout_s:
                time.sleep(DRAIN_POLL_S)
            time.sleep(DRAIN_FLUSH_S)  # the last answers' bytes leave the replica, the ingress and the proxy
        serve.shutdown()
        ray.shutdown()  # the local cluster this process started goes with it
        sys.exit(0)

    ray.init()
    drain = DrainState.options(name=DRAIN_ACTOR, namespace=DRAIN_NAMESPACE).remote()
    signal.signal(signal.SIGTERM, stop)  # after ray.init, which installs its own (it would exit at once)
    signal.signal(signal.SIGINT, stop)
    serve.start(http_options={"host": opts.host, "port": opts.port})
    serve.run(build_app(json.loads(opts.args)), name="ttcore", route_prefix="/")
    print(f"serving on http://{opts.host}:{opts.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
