"""Sec. 4.5: joint heads initialized from a base model keep its marginals and likelihood exactly."""

import copy
import dataclasses

import pytest
import torch

from ttcore.losses import forward_mask
from ttcore.models import DiTConfig, JointModel, ModelConfig

V, L = 6, 5


def _base():
    torch.manual_seed(0)
    cfg = ModelConfig(DiTConfig(vocab_size=V + 1, out_vocab=V, length=L, hidden_dim=16, cond_dim=8,
                                n_blocks=1, n_heads=2))
    model = JointModel(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("decomposition,rank", [("cp", 4), ("tt", 3)])
@pytest.mark.parametrize("head", ["1layer", "2layer"])
def test_zero_noise_init_preserves_marginals_and_likelihood(decomposition, rank, head):
    base = _base()
    joint = JointModel.from_base(base, decomposition, rank, head, noise=0.0).double().eval()
    g = torch.Generator().manual_seed(1)
    x0 = torch.randint(0, V, (4, L), generator=g)
    x_t, mask = forward_mask(x0, torch.full((4,), 0.6, dtype=torch.float64), V, g)
    with torch.no_grad():
        ob, oj = base(x_t, mask), joint(x_t, mask)
    torch.testing.assert_close(oj.log_prob(x0), ob.log_prob(x0))
    free = torch.full_like(x_t, -1)
    torch.testing.assert_close(oj.joint(x_t).marginals(free).double(),
                               ob.joint(x_t).marginals(free).double(), rtol=1e-5, atol=1e-6)


def test_noise_breaks_symmetry_and_two_layer_freezes_w():
    base = _base()
    joint = JointModel.from_base(base, "tt", 2, "2layer", noise=0.1, generator=torch.Generator().manual_seed(0))
    assert not joint.output_layer.linear.weight.requires_grad
    w = joint.head.mix.weight.view(4, 16, 16)
    assert (w[0] - w[1]).abs().max() > 0
    one = JointModel.from_base(base, "cp", 3, "1layer", noise=0.1, generator=torch.Generator().manual_seed(0))
    assert one.output_layer.linear is None  # W' replaces W


def test_base_must_be_rank_one():
    base = _base()
    joint = JointModel.from_base(base, "tt", 2)
    with pytest.raises(ValueError, match="base model must be rank 1"):
        JointModel.from_base(joint, "tt", 2)
    with pytest.raises(ValueError, match="decomposition must be one of"):
        ModelConfig(base.cfg.dit, "tucker", 2)


@pytest.mark.parametrize("decomposition,rank", [("cp", 3), ("tt", 2)])
@pytest.mark.parametrize("head", ["1layer", "2layer"])
@pytest.mark.parametrize("gather_max_outputs", [0, 10**6], ids=["grouped", "gathered"])
def test_select_logits_are_slices_of_all_outputs(decomposition, rank, head, gather_max_outputs):
    joint = JointModel.from_base(_base(), decomposition, rank, head, noise=0.2,
                                 generator=torch.Generator().manual_seed(0)).eval()
    joint.head.gather_max_outputs = gather_max_outputs
    h = torch.randn(7, 16, dtype=torch.float64)
    full = joint.head.component_logits(h)  # [n, e, v]
    count = 1 if decomposition == "cp" else rank
    start = torch.tensor([0, 1, 1, 0, 1, 0, 1]) * count
    got = joint.head.select_logits(h, start, count)
    for i in range(7):
        torch.testing.assert_close(got[i], full[i, start[i]:start[i] + count])



@pytest.mark.parametrize("decomposition,rank", [("cp", 12), ("tt", 4)])
@pytest.mark.parametrize("head", ["1layer", "2layer"])
@pytest.mark.parametrize("gather_max_outputs,c", [(0, 1), (0, 3), (10**6, 1)], ids=["grouped", "eighth", "gathered"])
def test_gather_logits_are_any_outputs_of_each_row(decomposition, rank, head, gather_max_outputs, c):
    """Each row's own c outputs (the fast adaptive step's heaviest), by every branch: one matmul per distinct
    output (c = 1 of 12 / 16 with no gather budget), one full pass when c is at least an eighth of E, or a
    full pass within the gather budget."""
    joint = JointModel.from_base(_base(), decomposition, rank, head, noise=0.2,
                                 generator=torch.Generator().manual_seed(0)).eval()
    joint.head.gather_max_outputs = gather_max_outputs
    h = torch.randn(7, 16, dtype=torch.float64)
    full = joint.head.component_logits(h)  # [n, e, v]
    outputs = torch.stack([torch.randperm(joint.head.e, generator=torch.Generator().manual_seed(i))[:c]
                           for i in range(7)])  # [n, c], distinct per row
    got = joint.head.gather_logits(h, outputs)
    assert got.shape == (7, c, full.shape[-1])
    for i in range(7):
        torch.testing.assert_close(got[i], full[i, outputs[i]])

@pytest.mark.parametrize("decomposition,rank,head", [("none", 1, "1layer"), ("cp", 3, "1layer"), ("tt", 2, "2layer")])
def test_bf16_linears_match_autocast_exactly(decomposition, rank, head):
    """cast_linears_ stores what CPU autocast would cast on every call: the outputs are bit-identical."""
    base = _base().float()
    model = base if decomposition == "none" else JointModel.from_base(
        base, decomposition, rank, head, noise=0.2, generator=torch.Generator().manual_seed(0)).eval()
    cast = copy.deepcopy(model).cast_linears_(torch.bfloat16)
    linears = [mod for mod in cast.modules() if isinstance(mod, torch.nn.Linear)]
    assert linears and all(mod.weight.dtype == torch.bfloat16 for mod in linears)
    x = torch.randint(0, V, (3, L))
    x[:, ::2] = V  # [MASK]
    mask = x == V
    outs = []
    for m in (model, cast):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            h = m.features(x)
            o = m.head_outputs(h, mask)
            start = torch.zeros(int(mask.sum()), dtype=torch.long)
            sel = m.head.select_logits(h[mask], start, rank if decomposition == "tt" else 1)
            outs.append([h, sel] + [getattr(o, f.name) for f in dataclasses.fields(o) if f.name != "mask"])
    assert outs[0][2].abs().max() > 0
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_bucketed_linears_change_no_output_and_bound_the_shapes():
    from ttcore.models.precision import bucket_linear_rows_, bucketed_rows
    sizes = {bucketed_rows(n) for n in range(1, 4097)}
    assert all(n <= bucketed_rows(n) <= 1.25 * n for n in range(1, 4097)) and len(sizes) < 60
    base = _base().float()
    model = JointModel.from_base(base, "tt", 3, "1layer", noise=0.2, generator=torch.Generator().manual_seed(0))
    plain = copy.deepcopy(model).eval().cast_linears_(torch.bfloat16)
    bucketed = bucket_linear_rows_(copy.deepcopy(plain))
    x = torch.randint(0, V + 1, (37, L))  # 37 rows: padded to 40 inside every linear
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        h1, h2 = plain.features(x), bucketed.features(x)
        s1 = plain.head.select_logits(h1.reshape(-1, h1.shape[-1]), torch.zeros(37 * L, dtype=torch.long), 3)
        s2 = bucketed.head.select_logits(h2.reshape(-1, h2.shape[-1]), torch.zeros(37 * L, dtype=torch.long), 3)
    assert torch.equal(h1, h2) and torch.equal(s1, s2)
