"""Prometheus metrics of the service (the only module that defines them). One registry per app, so
several apps can live in one process (tests, replicas)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ttcore_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.latency = Histogram("ttcore_request_latency_seconds", "Request latency (to the last byte of a "
                                 "non-streaming answer, to the done event of a stream)", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.first_event = Histogram("ttcore_time_to_first_event_seconds", "Arrival to the first step event",
                                     ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.samples = Counter("ttcore_samples_generated", "Sequences generated", ["model"], registry=r)
        self.tokens = Counter("ttcore_tokens_generated", "Tokens unmasked", ["model"], registry=r)
        self.steps = Counter("ttcore_denoising_steps", "Denoising steps taken (per request)", ["model"], registry=r)
        self.forward_samples = Histogram("ttcore_forward_batch_samples", "Sequences per backbone forward pass",
                                         ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.forward_requests = Histogram("ttcore_forward_batch_requests", "Requests sharing one forward pass",
                                          ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.forward_seconds = Counter("ttcore_forward_seconds", "Wall time in backbone forward passes",
                                       ["model"], registry=r)
        self.step_seconds = Counter("ttcore_engine_step_seconds", "Wall time of engine steps (forward + heads + "
                                    "sampling)", ["model"], registry=r)
        self.request_seconds = Histogram("ttcore_request_phase_seconds", "Per finished request: time by phase "
                                         "(queue; forward and sampling: its shares of batched steps; decode)",
                                         ["model", "phase"], buckets=LATENCY_BUCKETS, registry=r)
        self.tokens_per_step = Histogram("ttcore_tokens_per_step", "Tokens committed per denoising step "
                                         "(one request's sequences together)", ["model"], buckets=BATCH_BUCKETS,
                                         registry=r)
        self.queue_depth = Gauge("ttcore_queue_depth", "Requests admitted and not finished", registry=r)
        self.model_calls = Histogram("ttcore_model_calls_per_request", "Backbone calls per request",
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=r)
        self.rejected = Counter("ttcore_rejected", "Requests refused by backpressure", registry=r)
        self.cancelled = Counter("ttcore_cancelled", "Requests cancelled before finishing", registry=r)
        self.key_requests = Counter("ttcore_key_requests", "Compute requests per API key id (never the key)",
                                    ["key"], registry=r)
        self.key_limited = Counter("ttcore_key_limited", "Requests refused (429) by a per-key limit",
                                   ["key", "reason"], registry=r)
        self.score_pieces = Counter("ttcore_score_pieces", "Pieces of /score work run on a model's worker between "
                                    "generation steps (a micro-batch, or one ELBO draw of one)", ["model"], registry=r)
        self.automata_bytes = Gauge("ttcore_automaton_cache_bytes", "Bytes of the automata kept for regex / "
                                    "grammar requests (admitted requests' only; bounded by --max-automata-mb)",
                                    registry=r)
        self.automata = Gauge("ttcore_automaton_cache_entries", "Automata kept for regex / grammar requests",
                              registry=r)
        self.loop_lag = Histogram("ttcore_event_loop_lag_seconds", "How late the event loop's probe woke up (time "
                                  "the loop was held by work on it: no request or /health answered meanwhile)",
                                  buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30), registry=r)
        self.loop_lag_max = Gauge("ttcore_event_loop_lag_max_seconds", "The largest event-loop lag since the start",
                                  registry=r)
        self.pieces_between_steps = Histogram(
            "ttcore_worker_pieces_between_steps", "Pieces of other work (/score, timings) a model's worker ran "
            "between two consecutive steps of one generation request (at most 1: the worker's schedule is fair)",
            ["model"], buckets=(0, 1, 2, 4, 8, 16), registry=r)
        self.timeouts = Counter("ttcore_timeouts", "Requests ended by their deadline", ["model"], registry=r)
        self.too_large = Counter("ttcore_too_large", "Requests refused by admission (422): more compute or "
                                 "memory than the server's limits", ["model", "field"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
