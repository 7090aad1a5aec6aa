"""Every option of the service, typed once (name, type, default, rule, help).

``ServiceArgs`` is what a model server needs wherever it runs: ``python -m service`` builds its flags from
these fields (``EmbeddedArgs`` adds the ones only a process of its own has: address, port, logging, the
HTTP read deadline), the Ray Serve builder takes them as its application args (``deploy/serve_config.yaml``
sets some), and the engine, serving and security layers read their settings from them."""

import argparse
import typing

from pydantic import BaseModel, ConfigDict, Field

from ttcore.models import PRECISIONS

from . import default_checkpoints


class ServiceArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoints: str = Field(default_factory=default_checkpoints,
                             description="directory of checkpoint directories (default: $TTCORE_CHECKPOINTS or the "
                                         "bundled ones)")
    device: str = Field("cpu", description="cpu, cuda, cuda:N")
    precision: typing.Literal[tuple(PRECISIONS)] = Field(
        "auto", description="auto: bf16 where the CPU (AVX512-BF16 / AMX) or GPU runs bf16 matmuls natively")
    max_batch_samples: int = Field(256, ge=1, description="sequences per forward pass (continuous batching)")
    max_requests: int = Field(64, ge=1, description="admitted requests before 503 (per replica under Ray Serve)")
    threads: int = Field(0, ge=0, description="torch threads (0: torch's default)")
    api_key_file: str | None = Field(None, description="API keys, one per line (also $TTCORE_API_KEY, "
                                                       "comma-separated); none configured: the service is open")
    public_metrics: bool = Field(False, description="serve /metrics without a key")
    public_docs: bool = Field(False, description="serve /docs, /redoc, /openapi.json without a key")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger bodies get 413")
    cors_origins: list[str] = Field(default_factory=list, description="origins allowed by CORS (default: none)")
    key_max_concurrency: int = Field(16, ge=0, description="with API keys: requests in flight per key (429 over "
                                                           "it; 0: unlimited)")
    key_rate_per_minute: int = Field(600, ge=0, description="with API keys: requests per minute per key (429 "
                                                            "with Retry-After over it; 0: unlimited)")
    memory_budget_mb: int = Field(2048, ge=1, description="the most one step of one request may hold; larger "
                                                           "requests are drawn in micro-batches")
    max_timeout_s: float = Field(600.0, gt=0, description="the longest deadline of a request (its timeout_s may "
                                                          "shorten it): 504 past it")
    stall_s: float = Field(120.0, gt=0, description="/health answers 503 when a worker has been on one step "
                                                    "longer than this")
    max_step_s: float | None = Field(None, gt=0, description="admission refuses a request whose longest step is "
                                                             "estimated above this (default: half of stall_s)")
    release_idle_memory: bool = Field(True, description="when a model's queue has been empty for a second, return "
                                                        "the memory its requests freed to the OS (glibc "
                                                        "malloc_trim; CUDA's cache)")
    cuda_graphs: bool = Field(True, description="on CUDA: pad each step's backbone call to a batch-size bucket and "
                                                "replay it from a CUDA graph captured per bucket (off: eager)")
    compile_streams: bool = Field(True, description="on CUDA: the counter-based random streams drawn through "
                                                    "torch.compile (one fused kernel a draw instead of ~100 small "
                                                    "ones; the same bits), compiled when a model is first timed")
    max_stream_mb: float = Field(16.0, gt=0, description="a streamed /generate answer is estimated before it is "
                                                         "admitted (every step event holds every sequence) and "
                                                         "refused with a 422 above this many MB")
    max_automata_mb: float = Field(32.0, gt=0, description="the automata of admitted regex / grammar requests "
                                                           "kept for the next request that asks the same (least "
                                                           "recently used dropped past this many MB; refused "
                                                           "requests' automata are never kept)")
    reader_timeout_s: float = Field(30.0, gt=0, description="a request whose client stops reading (its unread "
                                                            "backlog full) is cancelled after this")
    allowed_hosts: list[str] | None = Field(
        None, description="Host names the server answers (* for any); default: with no API key on a loopback "
                          "address, loopback names only (DNS-rebinding protection); otherwise any")


class EmbeddedArgs(ServiceArgs):
    """``python -m service``: one process, uvicorn, no Ray."""

    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0 exposes it: set API keys)")
    port: int = Field(8000, ge=0, le=65535)
    log_level: str = Field("info", description="uvicorn's and ttcore's log level")
    read_timeout_s: float = Field(15.0, gt=0, description="a request's headers and body must arrive within this "
                                                          "(slow clients are disconnected)")
    drain_timeout_s: float = Field(30.0, ge=0, le=3600,
                                   description="on SIGTERM / SIGINT: /ready answers 503 (draining), new requests 503 "
                                               "with Retry-After, and requests in flight get this long to finish "
                                               "before the server exits (0: exit at once; a second signal too)")


def _flag_type(annotation):
    """The argparse type of a field (its non-None type), whether it takes a list, and its choices."""
    kind = annotation
    if typing.get_origin(kind) in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(kind) is typing.Literal:
        return str, False, typing.get_args(kind)
    if typing.get_origin(kind) is list:
        return typing.get_args(kind)[0], True, None
    return kind, False, None


def add_arguments(ap: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """A flag per field of ``model``: ``--max-batch-samples`` for ``max_batch_samples``, its default and help
    from the field (validated by the model afterwards, so a flag obeys the same rule as an app arg)."""
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        kind, many, choices = _flag_type(field.annotation)
        help_text = f"{field.description or ''} (default: {default})".strip()
        if kind is bool:  # --flag / --no-flag
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif many:
            ap.add_argument(flag, nargs="*", type=kind, default=default, help=help_text)
        else:
            ap.add_argument(flag, type=kind, default=default, choices=choices, help=help_text)
