"""Seeded outputs recorded before the structure refactor (tests/golden/record.py) are reproduced on
any CPU CI may land on: the float32 token samples of every format x ordering x sampler and the batched
steps bit for bit; the training losses within a relative 1e-4 (another CPU's kernels sum float32 in
another order: seen to differ in the last digits; a change to a loss moves it by far more); the bundled
checkpoint's bf16 samples in at least 95% of their tokens (AMX, AVX-512-BF16 and emulated bf16 matmuls
round differently, so a draw near a boundary can flip: seen, 1 token of 88 on an AMX CPU; a change to
the sampler or the model leaves about a third of them equal)."""

import json
import math

from golden.record import GOLDEN, outputs

LOSS_RTOL = 1e-4
BF16_AGREEMENT = 0.95


def _same(key: str, want, got) -> bool:
    if key.endswith("/loss"):
        return sorted(want) == sorted(got) and all(math.isclose(want[k], got[k], rel_tol=LOSS_RTOL, abs_tol=1e-7)
                                                   for k in want)
    if key.endswith("/bf16"):
        pairs = [(a, b) for wr, gr in zip(want, got) for a, b in zip(wr, gr)]
        shapes = len(want) == len(got) and all(len(a) == len(b) for a, b in zip(want, got))
        return shapes and sum(a == b for a, b in pairs) >= BF16_AGREEMENT * len(pairs)
    return want == got


def test_outputs_match_the_recorded_golden_outputs():
    want, got = json.loads(GOLDEN.read_text()), outputs()
    assert sorted(got) == sorted(want)
    differ = [k for k in want if not _same(k, want[k], got[k])]
    assert not differ, f"outputs changed for {differ}"


def test_the_comparison_can_fail():
    want, got = json.loads(GOLDEN.read_text()), outputs()
    want["tt/random"][0][0] = (want["tt/random"][0][0] + 1) % 5
    assert not _same("tt/random", want["tt/random"], got["tt/random"])
    loss = next(iter(want["tt/loss"]))
    want["tt/loss"][loss] *= 1 + 10 * LOSS_RTOL  # a real change to a loss is caught
    assert not _same("tt/loss", want["tt/loss"], got["tt/loss"])
    want["tt/loss"][loss] = got["tt/loss"][loss] * (1 + LOSS_RTOL / 10)  # a kernel's rounding is not
    assert _same("tt/loss", want["tt/loss"], got["tt/loss"])
    shuffled = [row[1:] + row[:1] for row in got["qm9-tt-r16/bf16"]]  # other samples of the same molecules' tokens
    assert not _same("qm9-tt-r16/bf16", want["qm9-tt-r16/bf16"], shuffled)
