"""Embedded mode: the service on one machine, no Ray.

    python -m service --checkpoints checkpoints --port 8000
"""

import argparse
import ipaddress
import logging
import os

import uvicorn

from ttcore.models import PRECISIONS

from . import default_checkpoints
from .app import create_app
from .engine import READER_TIMEOUT_S
from .http_guard import DEFAULT_READ_TIMEOUT_S, access_log_config, guarded_h11
from .security import DEFAULT_MAX_BODY_BYTES, LOOPBACK_HOSTS, ApiKeyError, SecurityConfig, load_api_keys
from .serving import DEFAULT_MAX_TIMEOUT_S, DEFAULT_MEMORY_BUDGET_MB, build_serving

log = logging.getLogger("ttcore.service")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--checkpoints", default=default_checkpoints(),
                    help="directory of checkpoint directories (default: $TTCORE_CHECKPOINTS or the bundled ones)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=PRECISIONS, default="auto",
                    help="auto: bf16 where the CPU (AVX512-BF16 / AMX) or GPU runs bf16 matmuls natively")
    ap.add_argument("--max-batch-samples", type=int, default=256)
    ap.add_argument("--max-requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--api-key-file", help="API keys, one per line (also $TTCORE_API_KEY, comma-separated); "
                                           "none configured: the service is open")
    ap.add_argument("--public-metrics", action="store_true", help="serve /metrics without a key")
    ap.add_argument("--public-docs", action="store_true", help="serve /docs, /redoc, /openapi.json without a key")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger bodies get 413")
    ap.add_argument("--cors-origins", nargs="*", default=[], help="origins allowed by CORS (default: none)")
    ap.add_argument("--key-max-concurrency", type=int, default=16,
                    help="with API keys: requests in flight per key (429 over it; 0: unlimited)")
    ap.add_argument("--key-rate-per-minute", type=int, default=600,
                    help="with API keys: requests per minute per key (429 with Retry-After over it; 0: unlimited)")
    ap.add_argument("--memory-budget-mb", type=int, default=DEFAULT_MEMORY_BUDGET_MB,
                    help="the most one step of one request may hold; larger requests are drawn in micro-batches")
    ap.add_argument("--max-timeout-s", type=float, default=DEFAULT_MAX_TIMEOUT_S,
                    help="the longest deadline of a request (its timeout_s may shorten it): 504 past it")
    ap.add_argument("--stall-s", type=float, default=120.0,
                    help="/health answers 503 when a worker has been on one step longer than this")
    ap.add_argument("--max-step-s", type=float, default=None,
                    help="admission refuses a request whose longest step is estimated above this (default: half of "
                         "--stall-s, so a healthy worker never trips /health)")
    ap.add_argument("--read-timeout-s", type=float, default=DEFAULT_READ_TIMEOUT_S,
                    help="a request's headers and body must arrive within this (slow clients are disconnected)")
    ap.add_argument("--allowed-hosts", nargs="*", default=None,
                    help="Host names the server answers (* for any); default: with no API key on a loopback "
                         "address, loopback names only (DNS-rebinding protection); otherwise any")
    ap.add_argument("--reader-timeout-s", type=float, default=READER_TIMEOUT_S,
                    help="a request whose client stops reading (its unread backlog full) is cancelled after this")
    args = ap.parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        keys = load_api_keys(args.api_key_file, os.environ.get("TTCORE_API_KEY"))
    except (ApiKeyError, OSError) as e:
        raise SystemExit(f"ttcore: {e}") from None  # one line naming the rule, not a traceback
    if args.allowed_hosts is not None:
        hosts = tuple(h.lower() for h in args.allowed_hosts)
    else:
        hosts = LOOPBACK_HOSTS if not keys and _loopback(args.host) else None
    security = SecurityConfig(keys, args.max_body_bytes, args.public_metrics, args.public_docs,
                              tuple(args.cors_origins), args.key_max_concurrency, args.key_rate_per_minute,
                              allowed_hosts=hosts)
    if keys:
        log.info("API keys: %d configured", len(keys))
    elif not _loopback(args.host):
        log.warning("no API key configured and bound to %s: anyone who reaches this port can use the service "
                    "(set --api-key-file or TTCORE_API_KEY)", args.host)
    serving = build_serving(args.checkpoints, device=args.device, precision=args.precision,
                            threads=args.threads or None, max_batch_samples=args.max_batch_samples,
                            max_requests=args.max_requests, memory_budget_mb=args.memory_budget_mb,
                            max_timeout_s=args.max_timeout_s, stall_s=args.stall_s, max_step_s=args.max_step_s,
                            reader_timeout_s=args.reader_timeout_s)
    uvicorn.run(create_app(serving, security), host=args.host, port=args.port, log_level=args.log_level,
                http=guarded_h11(args.read_timeout_s), log_config=access_log_config())


if __name__ == "__main__":
    main()
