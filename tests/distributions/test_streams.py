"""The counter-based streams (Philox4x32-10 in tensor ops): Random123's known answers, uniform and normal
draws by real statistical tests, and the property the service relies on: a sequence's uniforms are a
function of (seed, row, step, site, lane) alone, whatever else shares the batch."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from ttcore.distributions import Site, Streams, normal_from_uniform, sample_categorical, uniforms
from ttcore.distributions.streams import philox4x32

# Random123's kat_vectors, the three philox4x32 10 lines: counter (4 words), key (2 words) -> output (4 words)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,want", KNOWN_ANSWERS)
def test_philox_gives_random123s_known_answers(counter, key, want):
    words = lambda vals: tuple(torch.tensor([v], dtype=torch.int64) for v in vals)  # noqa: E731
    got = philox4x32(words(counter), words(key))
    assert tuple(int(w) for w in got) == want


def test_a_wrong_round_count_misses_the_known_answer():
    words = lambda vals: tuple(torch.tensor([v], dtype=torch.int64) for v in vals)  # noqa: E731
    counter, key, want = KNOWN_ANSWERS[2]
    assert tuple(int(w) for w in philox4x32(words(counter), words(key), rounds=9)) != want


def test_uniforms_are_uniform_and_independent_across_lanes_rows_steps_and_sites():
    u = Streams.of_request(2024, 64).uniform(Site.draw, 1000)  # 64,000 uniforms
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert stats.kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    counts = np.histogram(u.flatten().numpy(), bins=20, range=(0, 1))[0]
    assert stats.chisquare(counts).pvalue > 1e-3
    pairs = np.stack([u[:, :-1].flatten().numpy(), u[:, 1:].flatten().numpy()], 1)  # neighbouring lanes
    grid = np.histogram2d(pairs[:, 0], pairs[:, 1], bins=8, range=[[0, 1], [0, 1]])[0]
    assert stats.chisquare(grid.flatten()).pvalue > 1e-3
    rows = Streams.of_request(2024, 2).uniform(Site.draw, 5000)
    assert abs(stats.pearsonr(rows[0].numpy(), rows[1].numpy())[0]) < 0.05  # sequence 0 vs sequence 1
    other_step = Streams.of_request(2024, 2, step=1).uniform(Site.draw, 5000)
    other_site = Streams.of_request(2024, 2).uniform(Site.chain, 5000)
    other_seed = Streams.of_request(2025, 2).uniform(Site.draw, 5000)
    for other in (other_step, other_site, other_seed):
        assert abs(stats.pearsonr(rows[0].numpy(), other[0].numpy())[0]) < 0.05


def test_normals_from_the_streams_are_standard_normal():
    z = normal_from_uniform(Streams.of_request(3, 100).uniform(Site.latent, 400))  # 20,000 normals
    assert stats.kstest(z.flatten().numpy(), "norm").pvalue > 1e-3
    assert z.isfinite().all()


def test_a_sequences_uniforms_do_not_depend_on_the_batch_around_it():
    """The same (seed, row, step) gives the same uniforms alone, among other requests' rows, in any order."""
    alone = Streams.of_request(77, 3, step=4).uniform(Site.draw, 50)
    mixed = Streams(torch.tensor([5, 77, 9, 77, 77, 2**62]), torch.tensor([0, 2, 0, 0, 1, 3]),
                    torch.tensor([4, 4, 4, 4, 4, 0])).uniform(Site.draw, 50)
    assert torch.equal(mixed[[3, 4, 1]], alone)
    assert torch.equal(Streams.of_request(77, 3, step=4).rows(slice(1, 3)).uniform(Site.draw, 50), alone[1:])
    assert not torch.equal(mixed[0], alone[0])  # another seed


def test_categorical_draws_from_streams_have_the_right_law():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0], dtype=torch.float64)
    u = Streams.of_request(11, 1).uniform(Site.draw, 40000)[0]
    x = sample_categorical(p.expand(len(u), -1), u=u)
    counts = torch.bincount(x, minlength=5).numpy()
    assert counts[4] == 0  # probability zero: never drawn
    assert stats.chisquare(counts[:4], 40000 * p[:4].numpy()).pvalue > 1e-3


def test_uniforms_take_a_generator_or_streams_and_check_the_rows():
    g = torch.Generator().manual_seed(0)
    assert uniforms(g, 3, 4, "cpu", Site.draw).shape == (3, 4)
    with pytest.raises(ValueError, match="Streams of 2 rows"):
        uniforms(Streams.of_request(0, 2), 3, 4, "cpu", Site.draw)
    assert math.isclose(float(Streams.of_request(0, 1).uniform(Site.draw, 1)), float(
        Streams.of_request(0, 1).uniform(Site.draw, 1)))


def test_compiled_streams_give_the_eager_bits_and_fall_back_to_eager_when_compiling_fails():
    """compile_streams (one fused kernel per draw; on CUDA in the service) changes no bit: checked here with the
    CPU compiler over batch sizes the dynamic shapes must cover. A backend that fails leaves the eager ops."""
    from ttcore.distributions import compile_streams

    cases = [Streams.of_request(3, 1, step=2), Streams.of_request(2**63 - 1, 5, step=0),
             Streams(torch.tensor([5, 77, 9]), torch.tensor([0, 2, 1]), torch.tensor([4, 0, 9]))]
    eager = [(s.uniform(Site.draw, w), w) for s in cases for w in (1, 54)]
    try:
        compile_streams("cpu")
        compiled = [s.uniform(Site.draw, w) for s in cases for w in (1, 54)]
        assert all(torch.equal(a, b) for (a, _), b in zip(eager, compiled))

        def broken(gm, example_inputs):
            raise RuntimeError("no compiler here")

        compile_streams("cpu", backend=broken)
        with pytest.warns(RuntimeWarning, match="eager ops from now on"):
            again = cases[2].uniform(Site.draw, 54)
        assert torch.equal(again, eager[5][0])
        assert torch.equal(cases[2].uniform(Site.draw, 54), again)  # eager now, and no second warning needed
    finally:
        compile_streams("cpu", enabled=False)


def test_enabling_compiled_streams_imports_nothing_until_such_a_device_draws():
    """The service enables them for CUDA at start; on a machine that never draws on CUDA, torch.compile's
    import (about a second) must not be paid."""
    import subprocess
    import sys

    code = ("import sys\nfrom ttcore.distributions import Site, Streams, compile_streams\ncompile_streams('cuda')\n"
            "Streams.of_request(1, 2).uniform(Site.draw, 3)\nprint('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr[-2000:]
