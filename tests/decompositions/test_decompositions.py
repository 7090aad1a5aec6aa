"""The decomposition registry and the interfaces: every joint, head output and model conforms, and the
registry is what the model, the sampler and the API accept."""

import itertools

import pytest
import torch
from explicit import ExplicitCP, ExplicitTT, PerfectMarginals
from tiny import tiny_model

from ttcore.decompositions import DECOMPOSITIONS, Denoiser, HeadOutputs, get_decomposition
from ttcore.distributions import CP, Factorized, JointDistribution, TensorTrain, tt_cores_from_logits
from ttcore.models import DiTConfig, ModelConfig

V, L, R = 4, 5, 3


@pytest.mark.parametrize("name", list(DECOMPOSITIONS))
def test_head_outputs_build_a_joint_that_scores_like_the_outputs(name):
    model = tiny_model(name, V, L, R, perturb=0.3, noise=0.3).double()
    x0 = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(0))
    mask = torch.rand(3, L, generator=torch.Generator().manual_seed(1)) < 0.6
    mask[:, 0] = True
    x_t = torch.where(mask, V, x0)
    with torch.no_grad():
        out = model(x_t, mask)
    assert isinstance(out, HeadOutputs) and isinstance(model, Denoiser)
    joint = out.joint(x_t)
    assert isinstance(joint, JointDistribution)
    torch.testing.assert_close(joint.log_prob(x0).double(), out.log_prob(x0).double(), rtol=1e-5, atol=1e-5)
    marg = joint.marginals(torch.where(mask, -1, x_t))[mask]  # [m, v]
    want = marg.gather(-1, x0[mask][:, None]).squeeze(-1).log()
    torch.testing.assert_close(out.marginal_log_probs(x0).double(), want.double(), rtol=1e-5, atol=1e-5)
    assert (out.auxiliary_loss() > 0) == (name == "tt")  # only TT has L_C, and the noisy head misses it
    assert model.head.e == DECOMPOSITIONS[name].outputs_per_position(R if name != "none" else 1)


def test_the_three_joints_and_the_explicit_models_conform():
    p = torch.full((1, L, V), 1 / V)
    assert isinstance(Factorized(p), JointDistribution)
    assert isinstance(CP(torch.ones(1, 1), p[:, :, None]), JointDistribution)
    assert isinstance(TensorTrain(p[..., None, None]), JointDistribution)
    assert not isinstance(torch.zeros(1), JointDistribution)
    cores = torch.full((L, V, 2, 2), 1 / (2 * V), dtype=torch.float64)
    for model in (ExplicitTT(cores), ExplicitCP(torch.ones(1), torch.full((L, 1, V), 1 / V)),
                  PerfectMarginals(torch.full((V ** 2,), 1 / V ** 2), V, 2)):
        assert isinstance(model, Denoiser)


def test_registries_are_what_configs_and_the_api_accept_and_document():
    from service.schema import GenerateRequest
    from ttcore.decompositions import CONTRACTIONS
    from ttcore.sampling import ADAPTIVE, EB_PROXIES, PREDETERMINED, SCHEDULES
    orderings = tuple(PREDETERMINED) + tuple(ADAPTIVE)  # the schema's choices, in this order
    properties = GenerateRequest.model_json_schema()["properties"]
    for field, registry in [("decomposition", DECOMPOSITIONS), ("ordering", orderings), ("schedule", SCHEDULES),
                            ("eb_proxy", EB_PROXIES), ("contraction", CONTRACTIONS)]:
        prop = properties[field]
        enum = prop["enum"] if "enum" in prop else prop["anyOf"][0]["enum"]
        assert enum == list(registry), field
        assert all(f"`{name}`" in prop["description"] for name in registry), field
    with pytest.raises(ValueError, match="decomposition must be one of none, cp, tt; got 'mps'"):
        get_decomposition("mps")
    with pytest.raises(ValueError, match="got 'mps'"):
        ModelConfig(DiTConfig(vocab_size=5, out_vocab=4, length=3), decomposition="mps")


def _view_setting(name):
    model = tiny_model(name, V, L, R, perturb=0.5, noise=0.5).double()
    if name == "tt":
        with torch.no_grad():  # an untrained contracted-core head predicts uniform Gbar: make it a wrong guess
            model.head.contracted.weight.normal_(0, 2.0)
    g = torch.Generator().manual_seed(2)
    x = torch.where(torch.rand(4, L, generator=g) < 0.4, torch.randint(0, V, (4, L), generator=g), V)
    x[:, 1] = V
    masked = x == V
    chosen = masked & (torch.rand(4, L, generator=g) < 0.5)
    chosen[:, 1] = True
    chosen[3] = False  # a sequence with nothing chosen
    with torch.no_grad():
        h = model.features(x)
    return model, x, masked, chosen, h


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("name", list(DECOMPOSITIONS))
def test_chosen_marginals_are_the_joints_marginals_at_those_positions(name, temperature):
    """The rank-1 view of a predetermined step computes only the chosen positions' marginals: with the exact
    contraction (and for CP / rank 1, with either) they equal the whole joint's exact marginals there
    (``JointDistribution.marginals``, brute-force tested), with known positions, other masked positions
    summed out, and positions after the last chosen one."""
    model, x, masked, chosen, h = _view_setting(name)
    for contraction in ["exact"] + (["head"] if name != "tt" else []):
        with torch.no_grad():
            got = model.format.marginals_at(model.head, h, masked, chosen, temperature, contraction)
            want = model.head_outputs(h, masked).joint(x, temperature).marginals(torch.where(masked, -1, x))
        assert got.dtype == torch.float64 and got.shape == (int(chosen.sum()), V)
        torch.testing.assert_close(got, want[chosen].double(), rtol=1e-5, atol=1e-6)  # the joint holds float32


def test_tt_chosen_marginals_with_the_head_are_those_of_the_joint_the_head_step_draws_from():
    """``contraction="head"``: the marginals of the TT whose masked positions outside T are the head's
    Gbar_j (the joint ``TTDecomposition.draw`` samples with the head), by enumerating that joint: x_T over
    all values, (1/r) 1^T M_1 .. M_l 1 with M = G_i(x^i) on T, Gbar_i on the other masked, I on known."""
    model, x, masked, chosen, h = _view_setting("tt")
    with torch.no_grad():
        got = model.format.marginals_at(model.head, h, masked, chosen, 1.0, "head")
        cores = tt_cores_from_logits(model.head.core_logits(h.flatten(0, 1)).double()).view(4, L, V, R, R)
        gbar = model.head.contracted_cores(h.flatten(0, 1)).double().view(4, L, R, R)
    want = []
    for n in range(4):
        t = chosen[n].nonzero()[:, 0].tolist()
        marg = torch.zeros(len(t), V, dtype=torch.float64)
        for xs in itertools.product(range(V), repeat=len(t)):
            vec = torch.full((R,), 1 / R, dtype=torch.float64)
            for i in range(L):
                mat = (cores[n, i, xs[t.index(i)]] if i in t else gbar[n, i] if masked[n, i]
                       else torch.eye(R, dtype=torch.float64))
                vec = vec @ mat
            for a, i in enumerate(t):
                marg[a, xs[a]] += vec.sum()
        want.append(marg / marg.sum(-1, keepdim=True) if t else marg)
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-6, atol=1e-7)  # the head returns float32 Gbar
    exact = model.format.marginals_at(model.head, h, masked, chosen, 1.0, "exact")
    assert (got - exact).abs().max() > 1e-3  # the head's guess is not the exact sum


@pytest.mark.parametrize("name", list(DECOMPOSITIONS))
def test_a_draw_with_nothing_chosen_draws_nothing(name):
    """A batch's rows with no position in T (their runs between steps): every format's draw gives -1s."""
    model = tiny_model(name, V, L, R, perturb=0.3, noise=0.3)
    x = torch.full((3, L), model.cfg.dit.mask_id)
    h = torch.randn(3, L, model.cfg.dit.hidden_dim)
    masked, chosen = torch.ones(3, L, dtype=torch.bool), torch.zeros(3, L, dtype=torch.bool)
    with torch.no_grad():
        out = model.format.draw(model.head, h, x, masked, chosen, 1.0, torch.Generator().manual_seed(0), "head")
    assert (out == -1).all()
