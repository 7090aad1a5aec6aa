"""Counter-based random streams: every uniform a generation draws is a pure function of (the request's seed,
the sequence's index in its request, the step, the draw's site, its lane), so a sequence's tokens never depend
on which other sequences share its batch, and a whole batch's uniforms come from ONE call whatever the number
of requests in it.

The function is Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"; the
generator cuRAND and PyTorch's CUDA RNG use), written in int64 tensor ops so that it runs, bit for bit the
same, on any device and inside a captured graph. Its counter is (lane, site, step, row), its key the seed's
two 32-bit halves. Two of its four output words make one float64 uniform in [0, 1) with 53 random bits.

Library code that takes a ``torch.Generator`` also takes ``Streams`` (``uniforms``), so the samplers and the
distributions draw from either. ``compile_streams("cuda")`` draws through ``torch.compile`` on that device type:
the ~100 small int64 ops of a call become one fused kernel (on a GPU, ~100 kernel launches fewer per draw), the
same bits.
"""

import warnings
from collections.abc import Callable
from enum import IntEnum

import torch

MASK32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # the round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # the key schedule's increments (Weyl sequence)
PHILOX_ROUNDS = 10


class Site(IntEnum):
    """What a uniform is for: each use draws from its own part of the counter space."""
    plan = 1  # a predetermined ordering's priorities (once per run)
    latent = 2  # VADD's z ~ p(z) (once per run)
    coins = 3  # Bernoulli unmasking counts, one coin per position
    draw = 4  # a step's joint draw
    chain = 5  # the chain rule's picks
    proposal = 6  # an AR-guided step's proposals: EDLM's candidates, DCD's autoregressive draws
    select = 7  # EDLM's pick among its candidates
    candidates = 64  # EDLM's joint proposals: candidate j's draw at its own sites, from 64 (j + 1) on (``offset``)


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor],
               rounds: int = PHILOX_ROUNDS) -> tuple[torch.Tensor, ...]:
    """Philox4x32-R on int64 tensors holding 32-bit words: 4 counter words and 2 key words (broadcastable) ->
    4 output words. A 32 x 32-bit product fits in int64's bit pattern (it wraps like uint64), so its high
    word is an arithmetic shift and a mask. The even and odd words travel as pairs, one op per pair."""
    m = torch.tensor(PHILOX_M, dtype=torch.int64, device=counter[0].device)[:, None]
    w = torch.tensor(PHILOX_W, dtype=torch.int64, device=counter[0].device)[:, None]
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(*counter, *key)  # (torch.broadcast_shapes imports _refs: 0.3 s)
    shape = c0.shape
    even = torch.stack([c0, c2]).reshape(2, -1)  # [2, n]: words 0, 2
    odd = torch.stack([c1, c3]).reshape(2, -1)  # [2, n]: words 1, 3
    k = torch.stack([k0, k1]).reshape(2, -1)  # [2, n]
    bumps = torch.arange(rounds, dtype=torch.int64, device=k.device)[:, None, None]
    keys = (k + bumps * w) & MASK32  # [rounds, 2, n]: the key bumped before every round after the first
    for r in range(rounds):
        prod = even * m  # [M0 * c0, M1 * c2]
        hi, lo = (prod >> 32) & MASK32, prod & MASK32
        even, odd = hi.flip(0) ^ odd ^ keys[r], lo.flip(0)  # (hi1 ^ c1 ^ k0, hi0 ^ c3 ^ k1), (lo1, lo0)
    return tuple(t.view(shape) for t in (even[0], odd[0], even[1], odd[1]))


def to_unit(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """Two 32-bit words -> a float64 uniform in [0, 1): the low 53 of their 64 bits (the low 21 of ``hi`` above
    all 32 of ``lo``), times 2^-53."""
    bits = ((hi & 0x1FFFFF) << 32) | lo  # 21 + 32 = 53 bits
    return bits.double() * (2.0 ** -53)


class Streams:
    """The counter-based streams of a batch of sequences: ``seed`` [b] (each sequence's request seed, a
    nonnegative 64-bit int), ``row`` [b] (its index in its request) and ``step`` [b] (its request's step
    counter). ``uniform(site, width)`` gives each sequence its ``width`` uniforms of that site at that step;
    ``rows(index)`` the streams of some of the sequences."""

    def __init__(self, seed: torch.Tensor, row: torch.Tensor, step: torch.Tensor):
        self.seed, self.row, self.step = seed, row, step

    @classmethod
    def of_request(cls, seed: int, rows: int, step: int = 0, device=None) -> "Streams":
        """The streams of one request's ``rows`` sequences."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        return cls(torch.full((rows,), seed, dtype=torch.int64, device=device),
                   torch.arange(rows, device=device), torch.full((rows,), step, dtype=torch.int64, device=device))

    def __len__(self) -> int:
        return self.seed.shape[0]

    @property
    def device(self) -> torch.device:
        return self.seed.device

    def rows(self, index) -> "Streams":
        return Streams(self.seed[index], self.row[index], self.step[index])

    def offset(self, sites: int) -> "Streams":
        """These streams with every site moved by ``sites``: a draw through library code that takes its uniforms
        at fixed sites, repeated with new uniforms (EDLM's j-th joint candidate: ``Site.candidates`` (j + 1))."""
        return _OffsetStreams(self.seed, self.row, self.step, sites)

    def uniform(self, site: int, width: int) -> torch.Tensor:
        """[b, width] float64 uniforms in [0, 1): lane i of each sequence at ``site``."""
        compiled = _compiled(self.device.type)
        if compiled is not None:
            try:
                return compiled(self.seed, self.row, self.step, int(site), width)
            except Exception as e:  # noqa: BLE001 (no compiler, an op it cannot lower): the eager ops serve
                compile_streams(self.device.type, enabled=False)
                warnings.warn(f"compiled streams on {self.device.type} failed ({type(e).__name__}: {e}); drawing "
                              "with eager ops from now on (the same bits)", RuntimeWarning, stacklevel=2)
        return stream_uniforms(self.seed, self.row, self.step, int(site), width)


class _OffsetStreams(Streams):
    """``Streams.offset``: each site read ``sites`` further on."""

    def __init__(self, seed, row, step, sites: int):
        super().__init__(seed, row, step)
        self.sites = sites

    def rows(self, index) -> "Streams":
        return _OffsetStreams(self.seed[index], self.row[index], self.step[index], self.sites)

    def offset(self, sites: int) -> "Streams":
        return _OffsetStreams(self.seed, self.row, self.step, self.sites + sites)

    def uniform(self, site: int, width: int) -> torch.Tensor:
        return super().uniform(int(site) + self.sites, width)


def stream_uniforms(seed: torch.Tensor, row: torch.Tensor, step: torch.Tensor, site: int,
                    width: int) -> torch.Tensor:
    """``Streams.uniform`` as a pure function of its tensors: [b, width] float64 uniforms, lane i of each
    sequence (seed, row, step) at ``site``."""
    lanes = torch.arange(width, dtype=torch.int64, device=seed.device)[None, :]
    col = lambda t: (t & MASK32)[:, None]  # noqa: E731
    counter = (lanes, torch.full_like(lanes, site), col(step), col(row))
    w0, w1, _, _ = philox4x32(counter, (col(seed), col(seed >> 32)))
    return to_unit(w0, w1)


_BACKENDS: dict[str, str | Callable] = {}  # device type -> torch.compile backend (compile_streams)
_COMPILED: dict[str, Callable] = {}  # device type -> stream_uniforms compiled, made on its first draw


def compile_streams(device_type: str = "cuda", enabled: bool = True, backend: str | Callable = "inductor") -> None:
    """Draw the streams of tensors on ``device_type`` through ``torch.compile`` (``enabled=False``: eager again).
    Nothing is imported or compiled until such a tensor draws (torch.compile's import alone takes a second, which
    a server that never sees that device should not pay); then compiled once (seconds; sizes vary, so dynamic
    shapes). The bits are the eager ops' (tested). If compiling fails, the eager ops serve from then on and a
    warning says so once."""
    _COMPILED.pop(device_type, None)
    if enabled:
        _BACKENDS[device_type] = backend
    else:
        _BACKENDS.pop(device_type, None)


def _compiled(device_type: str) -> Callable | None:
    if device_type not in _BACKENDS:
        return None
    if device_type not in _COMPILED:
        _COMPILED[device_type] = torch.compile(stream_uniforms, dynamic=True, fullgraph=True,
                                               backend=_BACKENDS[device_type])
    return _COMPILED[device_type]


def warm_streams(device) -> None:
    """Compile now what ``compile_streams`` would compile on first use on ``device`` (one graph per size-1
    specialization: one sequence or many, one lane or many), so that no timed or served step pays it; nothing
    when the device type draws eagerly."""
    device = torch.device(device)
    if device.type in _BACKENDS:
        for rows in (1, 3):
            for width in (1, 5):
                Streams.of_request(0, rows, device=device).uniform(Site.draw, width)


def uniforms(generator, b: int, width: int, device, site: int) -> torch.Tensor:
    """[b, width] float64 uniforms from ``generator``: ``Streams`` (lanes 0..width-1 of ``site``, one stream
    per row) or a ``torch.Generator`` / None (torch's own stream, in row-major order)."""
    if isinstance(generator, Streams):
        if len(generator) != b:
            raise ValueError(f"Streams of {len(generator)} rows for a draw of {b} rows")
        return generator.uniform(site, width)
    return torch.rand((b, width), dtype=torch.float64, device=device, generator=generator)


def normal_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Standard normals from uniforms [..., 2n] by Box-Muller (first half radii, second half angles) -> [..., n]."""
    n = u.shape[-1] // 2
    radius = (-2.0 * torch.log1p(-u[..., :n])).sqrt()  # 1 - u in (0, 1]: finite
    return radius * torch.cos(2 * torch.pi * u[..., n:])
