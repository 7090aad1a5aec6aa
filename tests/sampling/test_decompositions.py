"""The decomposition registry and the interfaces: every joint, head output and model conforms, and the
registry is what the model, the sampler and the API accept."""

import pytest
import torch
from explicit import ExplicitCP, ExplicitTT, PerfectMarginals
from tiny import tiny_model

from ttcore.decompositions import DECOMPOSITIONS, Denoiser, HeadOutputs, get_decomposition
from ttcore.distributions import CP, Factorized, JointDistribution, TensorTrain
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
    if name != "none":
        assert model.head.e == DECOMPOSITIONS[name].outputs_per_position(R)


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
    from ttcore.sampling import ADAPTIVE, EB_PROXIES, ORDERINGS, PREDETERMINED, SCHEDULES
    assert set(ORDERINGS) == set(PREDETERMINED) | set(ADAPTIVE)
    properties = GenerateRequest.model_json_schema()["properties"]
    for field, registry in [("decomposition", DECOMPOSITIONS), ("ordering", ORDERINGS), ("schedule", SCHEDULES),
                            ("eb_proxy", EB_PROXIES), ("contraction", CONTRACTIONS)]:
        prop = properties[field]
        enum = prop["enum"] if "enum" in prop else prop["anyOf"][0]["enum"]
        assert enum == list(registry), field
        assert all(f"`{name}`" in prop["description"] for name in registry), field
    with pytest.raises(ValueError, match="decomposition must be one of none, cp, tt; got 'mps'"):
        get_decomposition("mps")
    with pytest.raises(ValueError, match="got 'mps'"):
        ModelConfig(DiTConfig(vocab_size=5, out_vocab=4, length=3), decomposition="mps")
