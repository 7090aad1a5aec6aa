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
    filled = (first_masked(x, model.cfg.dit.vocab_size - 1) + 1).clamp_max(x.shape[1])
    mods = [block.modulations(c[:1]) for block in model.backbone.blocks]
    return model.output_layer.features(y, c), KVCache(kv, filled, c[:1], mods)


def decode(model, x: torch.Tensor, cache: KVCache, pos: torch.Tensor | None = None) -> torch.Tensor:
    """An autoregressive ``model``'s features of x [b, l] at one position a row, ``pos`` [b] (None: each row's first
    masked position, l - 1 in a row with none), whose earlier positions ``cache`` holds (``usable``) and whose
    input x^{pos-1} is known; written into the cache. -> [b, l, d], zero at the other positions (a left-to-right
    step of one token reads no other)."""
    b, l = x.shape
    start = model.cfg.dit.vocab_size - 1  # [MASK], the causal model's start token
    pos = first_masked(x, start).clamp_max(l - 1) if pos is None else pos
    inputs = torch.where(pos > 0, x.gather(1, (pos - 1).clamp_min(0)[:, None])[:, 0], start)
    y = model.backbone.decode(inputs, pos, cache.layers, cache.mods)
    f = model.output_layer.features(y, cache.c)  # [b, 1, d]
    h = f.new_zeros(b, l, f.shape[-1])
    h[torch.arange(b, device=x.device), pos] = f[:, 0]
    cache.filled = torch.maximum(cache.filled, pos + 1)
    return h


def usable(cache: KVCache, x: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Per row [b] bool: whether ``decode`` can compute x's next position from ``cache`` (it holds every position
    before x's first masked one)."""
    return first_masked(x, mask_id).clamp_max(x.shape[1] - 1) <= cache.filled


def cached_features(model, caches: list[KVCache | None], sizes: list[int],
                    x: torch.Tensor) -> tuple[torch.Tensor, list[KVCache]]:
    """The features a step of several runs of an autoregressive ``model`` reads: x [B, l] their rows in order,
    ``sizes`` each run's count, ``caches`` each run's cache or None. A run whose cache cannot serve (None, or not
    ``usable`` for all its rows) is prefilled, the others decoded: at most two backbone calls whatever the
    number of runs. -> (features [B, l, d], each run's cache after the step)."""
    mask_id = model.cfg.dit.vocab_size - 1
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    held = [i for i, c in enumerate(caches) if c is not None]
    if held:  # one wait for all of them
        ok = usable(KVCache.cat([caches[i] for i in held]), _rows(x, starts, held), mask_id).tolist()
        at, fits = 0, {}
        for i in held:
            fits[i], at = all(ok[at:at + sizes[i]]), at + sizes[i]
        held = [i for i in held if fits[i]]
    fresh = [i for i in range(len(sizes)) if i not in held]
    out: list[KVCache | None] = [None] * len(sizes)
    parts = []
    if fresh:
        h_fresh, cache = prefill(model, _rows(x, starts, fresh))
        parts.append((fresh, h_fresh))
        out_fresh = cache.split([sizes[i] for i in fresh])
        for i, c in zip(fresh, out_fresh):
            out[i] = c
    if held:
        cache = KVCache.cat([caches[i] for i in held])
        parts.append((held, decode(model, _rows(x, starts, held), cache)))
        for i, c in zip(held, cache.split([sizes[i] for i in held])):
            out[i] = c
    if len(parts) == 1 and parts[0][0] == list(range(len(sizes))):
        return parts[0][1], out
    h = torch.empty(x.shape[0], x.shape[1], parts[0][1].shape[-1], dtype=torch.float32
                    if any(p.dtype != parts[0][1].dtype for _, p in parts) else parts[0][1].dtype, device=x.device)
    for runs, part in parts:
        h[_index(starts, runs, x.device)] = part.to(h.dtype)
    return h, out


def _index(starts: list[int], runs: list[int], device) -> torch.Tensor:
    return torch.tensor([r for i in runs for r in range(starts[i], starts[i + 1])], device=device)


def _rows(x: torch.Tensor, starts: list[int], runs: list[int]) -> torch.Tensor:
    """The rows of these runs (all of them: x itself)."""
    return x if len(runs) == len(starts) - 1 else x[_index(starts, runs, x.device)]
