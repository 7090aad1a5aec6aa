"""Seeded outputs recorded before the structure refactor (tests/golden/record.py) are reproduced
bit for bit: samples of every format x ordering x sampler, batched steps, a bundled checkpoint in
bf16, and the training losses (exact float equality)."""

import json

from golden.record import GOLDEN, outputs


def test_outputs_match_the_recorded_golden_outputs():
    want, got = json.loads(GOLDEN.read_text()), outputs()
    assert sorted(got) == sorted(want)
    differ = [k for k in want if got[k] != want[k]]
    assert not differ, f"outputs changed for {differ}"


def test_the_comparison_can_fail():
    want = json.loads(GOLDEN.read_text())
    want["tt/random"][0][0] = (want["tt/random"][0][0] + 1) % 5
    assert want["tt/random"] != outputs()["tt/random"]
