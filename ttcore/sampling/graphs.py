"""The backbone call of a denoising step with static shapes: sequences padded up to a batch-size bucket, and on
CUDA each bucket's call captured once as a CUDA graph and replayed (``torch.cuda.CUDAGraph``), so a step's
forward costs one launch instead of one per operator. Padding rows are [MASK]-only sequences whose features
are dropped: a sequence's features do not depend on the other rows of its batch (attention stays within a
sequence), so the real rows get what they get unpadded.

What is not captured runs eagerly and is counted (``calls``): a batch larger than the largest bucket, a
device other than CUDA, or a bucket whose capture failed. Only the forward is captured; the choice and the
joint draw (data-dependent shapes: the number of chosen positions) run eagerly, batched over all requests.
"""

import logging

import torch

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # batch sizes captured (sequences per forward)


def bucket_of(n: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket that holds ``n`` sequences, None when none does."""
    return next((b for b in buckets if b >= n), None)


def _features(model, x: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
    return model.features(x) if z is None else model.features(x, z=z)


class ForwardGraphs:
    """``model.features`` for a step's batch, padded to a bucket and, where ``capture`` (default: on CUDA),
    replayed from a CUDA graph per bucket (captured on first use, in the caller's compute context; the graphs
    share one memory pool). Call it as ``forward(x [n, l], latent [n, k] or None) -> h [n, l, d]``; the
    features are valid until the next call (they live in the graph's output buffer)."""

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS, capture: bool | None = None, pad: bool = True):
        self.model, self.buckets, self.pad = model, tuple(sorted(buckets)), pad
        device = next(model.parameters()).device
        self.capture = device.type == "cuda" if capture is None else capture
        if self.capture and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA model")
        self.mask_id = model.cfg.dit.mask_id
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, static x, static z, static h)
        self.failed: set[int] = set()  # buckets whose capture raised: eager from then on
        self.pool = None
        self.calls = {"graph": 0, "eager": 0}

    def __call__(self, x: torch.Tensor, latent: torch.Tensor | None = None) -> torch.Tensor:
        n = x.shape[0]
        b = bucket_of(n, self.buckets) if self.pad else None
        if b is None:
            self.calls["eager"] += 1
            return _features(self.model, x, latent)
        if self.capture and b not in self.failed:
            if b not in self.graphs:
                self._capture(b, x, latent)
            if b in self.graphs:
                graph, sx, sz, sh = self.graphs[b]
                sx[:n].copy_(x)
                sx[n:].fill_(self.mask_id)
                if sz is not None:
                    sz[:n].copy_(latent)
                    sz[n:].zero_()
                graph.replay()
                self.calls["graph"] += 1
                return sh[:n]
        self.calls["eager"] += 1
        if b == n:
            return _features(self.model, x, latent)
        xp = torch.cat([x, x.new_full((b - n, x.shape[1]), self.mask_id)])
        zp = None if latent is None else torch.cat([latent, latent.new_zeros(b - n, latent.shape[1])])
        return _features(self.model, xp, zp)[:n]

    def _capture(self, b: int, x: torch.Tensor, latent: torch.Tensor | None) -> None:
        sx = x.new_full((b, x.shape[1]), self.mask_id)
        sz = None if latent is None else latent.new_zeros(b, latent.shape[1])
        try:
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):  # warm-up outside the capture (lazy inits, autotuning)
                for _ in range(2):
                    _features(self.model, sx, sz)
            torch.cuda.current_stream(x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):  # other models run
                sh = _features(self.model, sx, sz)
            self.pool = graph.pool()
            self.graphs[b] = (graph, sx, sz, sh)
        except Exception as e:  # noqa: BLE001 - what cannot be captured runs eagerly
            log.warning("bucket %d: CUDA graph capture failed (%s: %s); its forward runs eagerly",
                        b, type(e).__name__, e)
            self.failed.add(b)
