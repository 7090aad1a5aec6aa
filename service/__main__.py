"""Embedded mode: the service on one machine, no Ray.

    python -m service --checkpoints checkpoints --port 8000

Every flag is a field of ``service.config.EmbeddedArgs`` (the same names as the Ray Serve app args).
"""

import argparse
import ipaddress
import logging
import os
import time

import uvicorn
from pydantic import ValidationError

from .app import create_app
from .config import EmbeddedArgs, add_arguments
from .engine import SHUTDOWN_MESSAGE
from .http_guard import access_log_config, guarded_h11
from .security import ApiKeyError, SecurityConfig, load_api_keys
from .serving import build_serving

log = logging.getLogger("ttcore.service")

CUT_FLUSH_S = 1.0  # after a drain's timeout cuts its requests: the most their closing events get to leave


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, EmbeddedArgs)
    try:
        args = EmbeddedArgs(**vars(ap.parse_args()))
    except ValidationError as e:  # a flag out of its range: one line per rule, no traceback
        raise SystemExit("ttcore: " + "; ".join(f"--{'-'.join(map(str, err['loc'])).replace('_', '-')}: "
                                                f"{err['msg']}" for err in e.errors())) from None
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        keys = load_api_keys(args.api_key_file, os.environ.get("TTCORE_API_KEY"))
    except (ApiKeyError, OSError) as e:
        raise SystemExit(f"ttcore: {e}") from None  # one line naming the rule, not a traceback
    security = SecurityConfig.from_args(args, keys, loopback_only_default=_loopback(args.host))
    if keys:
        log.info("API keys: %d configured", len(keys))
    elif not _loopback(args.host):
        log.warning("no API key configured and bound to %s: anyone who reaches this port can use the service "
                    "(set --api-key-file or TTCORE_API_KEY)", args.host)
    serving = build_serving(args)
    config = uvicorn.Config(create_app(serving, security), host=args.host, port=args.port, log_level=args.log_level,
                            http=guarded_h11(args.read_timeout_s), log_config=access_log_config(),
                            timeout_graceful_shutdown=2)
    DrainingServer(config, serving.engine, args.drain_timeout_s).run()


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before it exits: the first SIGTERM / SIGINT sets the engine draining
    (/ready 503, new requests 503 with Retry-After) and keeps serving until no request is in flight or
    ``drain_timeout_s`` has passed; then uvicorn's own shutdown. A second signal exits at once."""

    def __init__(self, config: uvicorn.Config, engine, drain_timeout_s: float):
        super().__init__(config)
        self.engine, self.drain_timeout_s, self.drain_started, self.cut_at = engine, drain_timeout_s, None, None

    def handle_exit(self, sig, frame) -> None:
        if self.drain_started is not None or self.drain_timeout_s == 0:
            return super().handle_exit(sig, frame)
        self.drain_started = time.monotonic()
        self.engine.draining = True
        log.info("draining: %d requests in flight, at most %g s", self.engine.in_flight, self.drain_timeout_s)

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s on the event loop: past the drain's timeout, the requests still in flight are cut, each
        ending with its error (a stream's last event ``code: shutdown``, a whole answer 503), and the server
        exits once they are answered (within ``CUT_FLUSH_S``)."""
        if self.drain_started is not None:
            now = time.monotonic()
            if self.cut_at is None and now - self.drain_started > self.drain_timeout_s and self.engine.in_flight:
                self.cut_at = now
                log.info("drain timed out: %d requests still in flight, ended with a shutdown error",
                         self.engine.cut(SHUTDOWN_MESSAGE))
            flushed = self.cut_at is None or not self.server_state.connections or now - self.cut_at > CUT_FLUSH_S
            if flushed and (self.engine.in_flight == 0 or self.cut_at is not None):
                log.info("drained: exiting")
                return True
        return await super().on_tick(counter)


if __name__ == "__main__":
    main()
