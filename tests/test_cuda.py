"""The same exactness checks on a CUDA device (skipped where there is none; run them when a GPU is lent)."""

import pytest
import torch
from brute import all_sequences, chi_square_pvalue, dense_tt
from tiny import run_together

from ttcore.distributions import TensorTrain
from ttcore.models import DiTConfig, JointModel, ModelConfig, prepare_for_inference
from ttcore.sampling import generate, make_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_tt_joint_sample_on_cuda_is_exact():
    n, l, v = 20000, 4, 3
    g = torch.Generator().manual_seed(3)
    tt = TensorTrain.from_logits(2 * torch.randn(1, l, v, 3, 3, generator=g, dtype=torch.float64))
    seqs = all_sequences(l, v).numpy()
    p = dense_tt(tt.cores[0].numpy(), seqs)
    positions = torch.ones(n, l, dtype=torch.bool, device="cuda")
    draws = TensorTrain(tt.cores.cuda().expand(n, -1, -1, -1, -1)).sample(
        positions, generator=torch.Generator("cuda").manual_seed(1)).cpu().numpy()
    assert chi_square_pvalue(draws, p, seqs) > 1e-3


@pytest.mark.parametrize("decomposition", ["none", "cp", "tt"])
def test_batched_runs_equal_lone_runs_on_cuda_in_bf16(decomposition):
    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig(vocab_size=9, out_vocab=8, length=10, hidden_dim=16, cond_dim=8,
                                            n_blocks=1, n_heads=2)))
    model = base if decomposition == "none" else JointModel.from_base(base, decomposition, 3, noise=0.3)
    model = prepare_for_inference(model.cuda(), "bf16")
    specs = [(3, 4, dict(seed=1)), (2, 25, dict(seed=2)), (4, 2, dict(seed=3, ordering="left_to_right"))]
    with model.compute_context():  # as the engine runs
        alone = [list(generate(model, n, k, **kw))[-1].tokens for n, k, kw in specs]
        again = [list(generate(model, n, k, **kw))[-1].tokens for n, k, kw in specs]
        runs = [make_run(model, n, k, **kw) for n, k, kw in specs]
        run_together(model, runs)
    for a, b, run in zip(alone, again, runs):
        assert a.is_cuda and torch.equal(a, b)  # seeded runs repeat on the device
        assert torch.equal(a, run.tokens) and (a < 8).all()


def test_cuda_graph_replays_give_the_eager_padded_tokens():
    """The service's captured forward (ForwardGraphs on CUDA) replays the same kernels as the eager call on the
    same padded batch: the same tokens, and every step replayed from a graph."""
    from ttcore.sampling import batch_step
    from ttcore.sampling.graphs import ForwardGraphs

    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig(vocab_size=9, out_vocab=8, length=10, hidden_dim=16, cond_dim=8,
                                            n_blocks=1, n_heads=2)))
    model = prepare_for_inference(JointModel.from_base(base, "tt", 3, noise=0.3).cuda(), "bf16")
    specs = [(3, 4, dict(seed=1)), (2, 6, dict(seed=2, ordering="top_prob")), (1, 3, dict(seed=3, eb_gamma=0.5))]
    out = {}
    for capture in (False, True):
        forward = ForwardGraphs(model, capture=capture)
        runs = [make_run(model, n, k, **kw) for n, k, kw in specs]
        with model.compute_context():
            while live := [r for r in runs if not r.done]:
                batch_step(model, live, forward)
        out[capture] = [r.tokens for r in runs]
        if capture:
            assert forward.calls["eager"] == 0 and forward.calls["graph"] > 0 and forward.graphs
    assert all(torch.equal(a, b) for a, b in zip(out[False], out[True]))


def test_batch_order_on_the_device_is_the_cpu_order():
    """The training split on a GPU is indexed by a permutation kept there (one copy per epoch): the same
    batches, in the same order, as on the CPU, across an epoch boundary and from a resumed position."""
    from ttcore.recipes import BatchOrder

    cpu, gpu = BatchOrder(10, 4, 3), BatchOrder(10, 4, 3, device="cuda")
    for _ in range(6):
        a, b = cpu.next(), gpu.next()
        assert b.device.type == "cuda" and torch.equal(a, b.cpu())
    resumed = BatchOrder(10, 4, 3, cpu.epoch, cpu.index, device="cuda")
    assert torch.equal(resumed.next().cpu(), cpu.next())


def test_compiled_streams_on_cuda_give_the_eager_bits():
    """The service draws its streams through torch.compile on CUDA (compile_streams): the same bits as the
    eager int64 ops, for one sequence and many, one lane and many."""
    from ttcore.distributions import Site, Streams, compile_streams

    cases = [Streams.of_request(s, rows, step=3, device="cuda") for s, rows in ((1, 1), (2**62, 7))]
    eager = [c.uniform(Site.draw, w) for c in cases for w in (1, 54)]
    try:
        compile_streams("cuda")
        compiled = [c.uniform(Site.draw, w) for c in cases for w in (1, 54)]
    finally:
        compile_streams("cuda", enabled=False)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
