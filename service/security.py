"""Who may call the service, and how much one request may send: API keys and the body-size limit.

A pure ASGI middleware in front of the FastAPI app (it sees every request before FastAPI reads the
body, so an oversized body is refused without being read):

- API keys as vLLM and TGI take them: ``Authorization: Bearer <key>``, keys from ``--api-key-file``
  (one per line, ``#`` comments) and ``$TTCORE_API_KEY`` (comma-separated). Each presented key is
  compared with every configured key in constant time (``hmac.compare_digest``). A missing or wrong
  key gets 401 with ``WWW-Authenticate: Bearer`` and a JSON error. No key configured: the service is
  open. ``/health``, ``/ready`` and the playground page (``/``, ``/playground/*``) are always
  open; ``/metrics`` and the API docs (``/docs``,
  ``/redoc``, ``/openapi.json``) need a key unless ``public_metrics`` / ``public_docs`` is set.
  Keys never leave this module: callers see a key id (``key1``, ``key2``, ... in configuration order).
- Body limit: a request whose Content-Length exceeds ``max_body_bytes`` gets 413 at once; a body sent
  without a length (chunked) is counted as it arrives and refused with 413 when it passes the limit.
- Host names: a server with no key that listens on loopback answers only requests whose ``Host`` is a
  loopback name (``localhost``, ``127.0.0.1``, ``[::1]``), so a web page cannot drive it through DNS
  rebinding (as Jupyter does); ``allowed_hosts`` widens or sets the list (``*``: any).
- One ``Authorization`` header: a request with two is refused (400), never resolved by picking one.
- Every answer carries ``X-Content-Type-Options: nosniff``; the playground's files (``/`` and
  ``/playground/*``) carry its Content-Security-Policy too (``SecurityHeaders``).
- Errors on ``/v1/*`` are OpenAI error objects (``{"error": {...}}``), elsewhere ``{"detail": ...}``.
- Per-key limits (with keys configured), on the routes that compute (``COMPUTE_ROUTES``): at most
  ``key_max_concurrency`` requests in flight per key (a stream counts until it ends) and
  ``key_rate_per_minute`` requests per minute (a token bucket: that many at once, refilled evenly);
  over either, 429 with ``Retry-After``. Counted per key id in ``ttcore_key_requests_total`` and
  ``ttcore_key_limited_total``.
"""

import hmac
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

ALWAYS_OPEN = ("/health", "/ready")
DOCS = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")
DOCS_ASSETS = "/docs-assets"  # Swagger UI's and ReDoc's own files (from fastapi-offline): static, always open
COMPUTE_ROUTES = {("POST", "/generate"), ("POST", "/v1/completions"), ("POST", "/score")}
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# the playground loads only its own files; pictures are fetched (with the API key) and shown from blob: URLs
PAGE_CSP = ("default-src 'self'; img-src 'self' blob: data:; style-src 'self'; script-src 'self'; "
            "connect-src 'self'; frame-ancestors 'none'")


class ApiKeyError(ValueError):
    """A configured API key breaks a rule (the message names which key, never its value)."""


def load_api_keys(path: str | os.PathLike | None = None, env: str | None = None) -> tuple[str, ...]:
    """Keys from a file (one per line; blank lines and ``#`` comments skipped) and from ``env`` (the
    value of $TTCORE_API_KEY, comma-separated). Refuses keys shorter than 16 characters."""
    keys = []
    if path is not None:
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    keys += [k.strip() for k in (env or "").split(",") if k.strip()]
    short = [i + 1 for i, k in enumerate(keys) if len(k) < 16]
    if short:
        raise ApiKeyError(f"API keys must be at least 16 characters; key(s) number {short} are shorter")
    return tuple(dict.fromkeys(keys))


@dataclass(frozen=True)
class SecurityConfig:
    """What ``SecurityMiddleware`` enforces; ``from_args`` builds it from the service's options (whose
    defaults live in ``service.config``)."""
    api_keys: tuple[str, ...]
    max_body_bytes: int
    public_metrics: bool
    public_docs: bool
    cors_origins: tuple[str, ...]
    key_max_concurrency: int  # per key; 0: unlimited
    key_rate_per_minute: int  # per key; 0: unlimited
    allowed_hosts: tuple[str, ...] | None = None  # Host names answered (without port); None or ("*",): any

    @classmethod
    def from_args(cls, args, keys: tuple[str, ...] = (), loopback_only_default: bool = False) -> "SecurityConfig":
        """From ``ServiceArgs``; ``loopback_only_default``: with no key and no ``allowed_hosts`` given, answer
        loopback Host names only (a keyless server listening on loopback)."""
        if args.allowed_hosts is not None:
            hosts = tuple(h.lower() for h in args.allowed_hosts)
        else:
            hosts = LOOPBACK_HOSTS if loopback_only_default and not keys else None
        return cls(tuple(keys), args.max_body_bytes, args.public_metrics, args.public_docs, tuple(args.cors_origins),
                   args.key_max_concurrency, args.key_rate_per_minute, hosts)

    def host_allowed(self, host: bytes | None) -> bool:
        if self.allowed_hosts is None or "*" in self.allowed_hosts:
            return True
        if host is None:
            return False
        name = host.decode("latin-1").strip().lower()
        name = name[1:name.index("]")] if name.startswith("[") and "]" in name else name.rsplit(":", 1)[0]
        return name in self.allowed_hosts

    def key_id(self, presented: str) -> str | None:
        """The id of the configured key equal to ``presented`` (constant time per key), else None."""
        found = None
        for i, key in enumerate(self.api_keys):
            if hmac.compare_digest(presented.encode(), key.encode()):
                found = f"key{i + 1}"
        return found

    def needs_key(self, path: str) -> bool:
        if (not self.api_keys or path in ALWAYS_OPEN or path == "/" or path.startswith("/playground/")
                or path.startswith(DOCS_ASSETS + "/")):
            return False  # the page and its files are static and hold nothing secret; its calls need the key
        if path == "/metrics":
            return not self.public_metrics
        if path in DOCS:
            return not self.public_docs
        return True


MAX_ECHO_CHARS = 200  # an error names the field and the rule; a client's own (possibly huge) input is cut


def clip(text, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters (an error message may quote a client's token or field name)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def error_body(path: str, status: int, detail: str) -> bytes:
    """The JSON error of a route: OpenAI's error object under ``/v1/``, ``{"detail": ...}`` elsewhere."""
    if path.startswith("/v1/"):
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return json.dumps({"error": {"message": detail, "type": kind, "param": None, "code": None}}).encode()
    return json.dumps({"detail": detail}).encode()


async def _send_json(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = (), path: str = "") -> None:
    body = error_body(path, status, detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class KeyLimits:
    """Per key id: requests in flight and a token bucket of ``rate_per_minute`` (capacity the same)."""

    def __init__(self, max_concurrency: int, rate_per_minute: int, clock=time.monotonic):
        self.max_concurrency, self.rate, self.clock = max_concurrency, rate_per_minute, clock
        self.in_flight: dict[str, int] = {}
        self.buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, at)

    def acquire(self, key_id: str) -> tuple[str, int] | None:
        """None when admitted (release it later), else (reason, retry-after seconds)."""
        if self.max_concurrency and self.in_flight.get(key_id, 0) >= self.max_concurrency:
            return "concurrency", 1
        if self.rate:
            now = self.clock()
            tokens, at = self.buckets.get(key_id, (float(self.rate), now))
            tokens = min(float(self.rate), tokens + (now - at) * self.rate / 60)
            if tokens < 1:
                self.buckets[key_id] = (tokens, now)
                return "rate", max(1, math.ceil((1 - tokens) * 60 / self.rate))
            self.buckets[key_id] = (tokens - 1, now)
        self.in_flight[key_id] = self.in_flight.get(key_id, 0) + 1
        return None

    def release(self, key_id: str) -> None:
        self.in_flight[key_id] -= 1


class SecurityMiddleware:
    """ASGI middleware: API keys, the body-size limit, then per-key limits. The key id goes to
    ``scope["state"]``. ``metrics`` (optional) counts requests and refusals per key id."""

    def __init__(self, app, config: SecurityConfig, metrics=None):
        self.app, self.config, self.metrics = app, config, metrics
        self.limits = KeyLimits(config.key_max_concurrency, config.key_rate_per_minute)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cfg = self.config
        path = scope["path"]
        headers = dict(scope["headers"])
        if not cfg.host_allowed(headers.get(b"host")):
            return await _send_json(send, 400, "this server answers only the Host names it is configured for (a "
                                               "keyless server on loopback: localhost; see --allowed-hosts)",
                                    path=path)
        if sum(k == b"authorization" for k, _ in scope["headers"]) > 1:
            return await _send_json(send, 400, "send at most one Authorization header", path=path)
        if cfg.needs_key(path):
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = auth.partition(" ")
            key_id = cfg.key_id(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
            if key_id is None:
                return await _send_json(send, 401, "a valid API key is required: Authorization: Bearer <key>",
                                        [(b"www-authenticate", b'Bearer realm="ttcore"')], path)
            scope.setdefault("state", {})["key_id"] = key_id
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_large = int(length) > cfg.max_body_bytes
            except ValueError:
                return await _send_json(send, 400, "Content-Length must be an integer", path=path)
            if too_large:
                return await _send_json(send, 413, f"request body over the limit of {cfg.max_body_bytes} bytes",
                                        path=path)
        elif scope["method"] in ("POST", "PUT", "PATCH"):  # no length (chunked): read it here, counting
            chunks, received, more = [], 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                received += len(chunks[-1])
                more = message.get("more_body", False)
                if received > cfg.max_body_bytes:
                    return await _send_json(send, 413, f"request body over the limit of {cfg.max_body_bytes} bytes",
                                            path=path)
            receive = _replay(b"".join(chunks), receive)
        key_id = scope.get("state", {}).get("key_id")
        if key_id is None or (scope["method"], scope["path"]) not in COMPUTE_ROUTES:
            return await self.app(scope, receive, send)
        refused = self.limits.acquire(key_id)
        if self.metrics is not None:
            self.metrics.key_requests.labels(key_id).inc()
        if refused is not None:
            reason, retry = refused
            if self.metrics is not None:
                self.metrics.key_limited.labels(key_id, reason).inc()
            limit = (f"{cfg.key_max_concurrency} requests in flight" if reason == "concurrency"
                     else f"{cfg.key_rate_per_minute} requests per minute")
            return await _send_json(send, 429, f"{key_id} is over its limit of {limit}",
                                    [(b"retry-after", str(retry).encode())], path)
        try:
            await self.app(scope, receive, send)
        finally:
            self.limits.release(key_id)


def _replay(body: bytes, receive):
    """A receive that first hands over ``body`` (already read), then defers to the real one."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay():
        return pending.pop() if pending else await receive()

    return replay


class SecurityHeaders:
    """ASGI middleware: ``X-Content-Type-Options: nosniff`` on every answer, and the playground's
    Content-Security-Policy on its page and files (``/``, ``/playground/*``), however they are reached."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        page = scope["path"] == "/" or scope["path"].startswith("/playground/")

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(b"x-content-type-options", b"nosniff")] if b"x-content-type-options" not in names else []
                if page and b"content-security-policy" not in names:
                    extra.append((b"content-security-policy", PAGE_CSP.encode()))
                message = dict(message, headers=[*message.get("headers", []), *extra])
            await send(message)

        await self.app(scope, receive, send_with_headers)
