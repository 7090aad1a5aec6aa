"""An autoregressive model's key-value cache: a generation step computes one position, not the whole sequence.

The causal DiT's position i reads x^{<i} only, so its keys and values in every block stay what they were as long
as x^{<i} does, and left-to-right generation never changes a known token. ``prefill`` runs the whole sequence once
and keeps every block's keys and values; each later step (``decode``) computes only the position it draws at, the
first masked one, attending to the kept positions before it. The features there are those of the full forward
(up to float rounding; tested against it in float64), and they are the only ones a left-to-right step of one token
reads. A step then costs one position's forward (plus attention over the cache) instead of l positions'.

A cache is only a saving: without one, or when a sequence moved on by more than the position it holds (never, in
left-to-right generation), the next step runs a prefill and the features are the same. The service drops the
caches of requests that sit out a step, so the memory held is that of one batch's sequences
(``ttcore.sampling.cost.kv_cache_row_bytes``)."""

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Every block's keys and values of b sequences: ``layers`` [(keys, values)], each [b, h, l, hd];
    positions below ``filled`` [b] hold those of the sequence's tokens. ``c``: the model's conditioning [1,
    cond_dim] and ``mods`` every block's adaLN modulations of it, the same for every sequence and step (an
    autoregressive model has no time and no latent), computed once."""
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    filled: torch.Tensor
    c: torch.Tensor
    mods: list

    @staticmethod
    def cat(caches: list["KVCache"]) -> "KVCache":
        """The caches' sequences, in order, in one cache (a copy; one cache: itself)."""
        if len(caches) == 1:
            return caches[0]
        layers = [tuple(torch.cat([c.layers[i][j] for c in caches]) for j in (0, 1))
                  for i in range(len(caches[0].layers))]
        return KVCache(layers, torch.cat([c.filled for c in caches]), caches[0].c, caches[0].mods)

    def split(self, sizes: list[int]) -> list["KVCache"]:
        """Consecutive pieces of ``sizes`` sequences (views: no copy)."""
        if len(sizes) == 1:
            return [self]
        parts = [[(k.split(sizes), v.split(sizes)) for k, v in self.layers], self.filled.split(sizes)]
        return [KVCache([(k[i], v[i]) for k, v in parts[0]], parts[1][i], self.c, self.mods)
                for i in range(len(sizes))]


def first_masked(x: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Each row's first masked position [b] (long; l where none is masked)."""
    masked = x == mask_id
    return torch.where(masked.any(1), masked.int().argmax(1), x.shape[1])


def prefill(model, x: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
    """An autoregressive ``model``'s features of x [b, l] at every position (``JointModel.features``) and the
    cache of its keys and values, valid up to each row's first masked position (the last that reads known tokens
    only)."""
    kv = []
    y, c = model.backbone(x, kv=kv)
    filled = (first_masked(x, model.cfg.dit.mask_id) + 1).clamp_max(x.shape[1])
    mods = [block.modulations(c[:1]) for block in model.backbone.blocks]
    return model.output_layer.features(y, c), KVCache(kv, filled, c[:1], mods)


def decode(model, x: torch.Tensor, cache: KVCache, pos: torch.Tensor | None = None) -> torch.Tensor:
    """An autoregressive ``model``'s features of x [b, l] at one position a row, ``pos`` [b] (None: each row's first
    masked position, l - 1 in a row with none), whose earlier positions ``cache`` holds (``usable``) and whose
    input x^{pos-1} is known; written into the cache. -> [b, l, d], zero at the other positions (a left-to-right
    step of one token reads no other)."""
    b, l = x.shape
    start = model.cfg.dit.mask_id  # [MASK], the causal model's start token
    pos = first_masked(x, start).clamp_max(l - 1) if pos is None else pos
    y = model.backbone.decode(model.backbone.read(x, pos[:, None]), pos[:, None], cache.layers, cache.mods)
    f = model.output_layer.features(y, cache.c)  # [b, 1, d]
    h = f.new_zeros(b, l, f.shape[-1])
    h[torch.arange(b, device=x.device), pos] = f[:, 0]
    cache.filled = torch.maximum(cache.filled, pos + 1)
    return h


def usable(filled: torch.Tensor, x: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Per row [b] bool: whether ``decode`` can compute x's next position from a cache whose ``filled`` [b] it is
    (the cache holds every position before x's first masked one)."""
    return first_masked(x, mask_id).clamp_max(x.shape[1] - 1) <= filled


def cached_features(model, caches: list[KVCache | None], sizes: list[int],
                    x: torch.Tensor) -> tuple[torch.Tensor, list[KVCache]]:
    """The features a step of several runs of an autoregressive ``model`` reads: x [B, l] their rows in order,
    ``sizes`` each run's count, ``caches`` each run's cache or None. A run whose cache cannot serve (None, or not
    ``usable`` for all its rows) is prefilled, the others decoded: at most two backbone calls whatever the
    number of runs. -> (features [B, l, d], each run's cache after the step)."""
    rows = x.split(sizes)
    held = [i for i, c in enumerate(caches) if c is not None]
    if held:  # one wait for all of them
        ok = usable(torch.cat([caches[i].filled for i in held]), torch.cat([rows[i] for i in held]),
                    model.cfg.dit.mask_id).split([sizes[i] for i in held])
        held = [i for i, fits in zip(held, torch.stack([o.all() for o in ok]).tolist()) if fits]
    fresh = [i for i in range(len(sizes)) if i not in held]
    out: list[KVCache | None] = [None] * len(sizes)
    h_runs: list[torch.Tensor | None] = [None] * len(sizes)
    for runs in (fresh, held):
        if not runs:
            continue
        xs = torch.cat([rows[i] for i in runs])
        if runs is fresh:
            h, cache = prefill(model, xs)
        else:
            cache = KVCache.cat([caches[i] for i in runs])
            h = decode(model, xs, cache)
        if len(runs) == len(sizes):  # one call for every run: its features are the step's, in order
            return h, cache.split(sizes)
        part = [sizes[i] for i in runs]
        h = h if h.dtype == torch.float64 else h.float()  # a prefill's and a decode's features meet in float32
        for i, c, hi in zip(runs, cache.split(part), h.split(part)):
            out[i], h_runs[i] = c, hi
    return torch.cat(h_runs), out
