"""VADD with the joint heads (Sec. 4.4, Eq. 21): the KL and the reparameterized loss against hand
computations, the joints' exactness given a fixed z (brute-force enumeration), and sampling with z drawn
once per sequence from the request's seed (chi-square against the joint given z; batch-independent)."""

import numpy as np
import pytest
import torch
from brute import all_sequences, chi_square_pvalue
from scipy import stats

from ttcore.distributions import Streams
from ttcore.losses import forward_mask, sample_times, vadd_loss
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.models.vadd import gaussian_kl, prior_sample, reparameterize
from ttcore.sampling import batch_step, generate, make_run

V, L, K = 3, 4, 5  # vocabulary, length, latent dimension


def tiny_vadd(decomposition: str = "tt", rank: int = 3, perturb: float = 0.5) -> JointModel:
    """A tiny VADD model, every denoiser weight perturbed (so z matters; the recognition network keeps its
    initialization), then its joint fine-tuning start."""
    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig(vocab_size=V + 1, out_vocab=V, length=L, hidden_dim=16, cond_dim=8,
                                            n_blocks=1, n_heads=2, latent_dim=K)))
    with torch.no_grad():
        for name, prm in base.named_parameters():
            if not name.startswith("recognition."):
                prm.add_(perturb * torch.randn_like(prm))
    if decomposition == "none":
        return base.eval()
    return JointModel.from_base(base, decomposition, rank, noise=0.3).eval()


def test_gaussian_kl_is_the_closed_form_of_the_diagonal_gaussians_kl():
    g = torch.Generator().manual_seed(0)
    mean, log_var = torch.randn(6, K, generator=g), torch.randn(6, K, generator=g)
    r = torch.distributions.Normal(mean, (0.5 * log_var).exp())
    p = torch.distributions.Normal(torch.zeros(K), torch.ones(K))
    torch.testing.assert_close(gaussian_kl(mean, log_var), torch.distributions.kl_divergence(r, p).sum(-1))
    assert gaussian_kl(torch.zeros(2, K), torch.zeros(2, K)).abs().max() == 0  # r = p


def test_reparameterized_draws_follow_r_and_carry_its_gradient():
    mean = torch.tensor([[1.5, -2.0]], requires_grad=True)
    log_var = torch.tensor([[0.0, np.log(0.25)]], dtype=torch.float32, requires_grad=True)
    z = reparameterize(mean.expand(20000, 2), log_var.expand(20000, 2), torch.Generator().manual_seed(1))
    for k, (m, s) in enumerate([(1.5, 1.0), (-2.0, 0.5)]):
        assert stats.kstest(z[:, k].detach().numpy(), "norm", args=(m, s)).pvalue > 1e-3
    z.sum().backward()
    assert torch.allclose(mean.grad, torch.full((1, 2), 20000.0))  # dz/dmean = 1 per draw
    assert log_var.grad.abs().sum() > 0


def test_vadd_loss_is_eq_21_computed_by_hand():
    model = tiny_vadd("tt").train()
    x0 = torch.randint(0, V, (6, L), generator=torch.Generator().manual_seed(2))
    out = vadd_loss(model, x0, V, kl_weight=0.3, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)  # the same stream, step by step
    t = sample_times(6, 1e-3, x0.device, g)
    x_t, mask = forward_mask(x0, t, V, g)
    mean, log_var = model.recognition(x0, x_t)
    z = mean + (0.5 * log_var).exp() * torch.randn(mean.shape, generator=g)
    heads = model(x_t, mask, sigma=t, z=z)
    nll = -heads.log_prob(x0)
    kl = 0.5 * (mean ** 2 + log_var.exp() - 1 - log_var).sum(-1)
    expected = ((nll + 0.3 * kl) / t).sum() / (6 * L) + heads.auxiliary_loss()
    torch.testing.assert_close(out["loss"], expected)
    torch.testing.assert_close(out["kl"], kl.mean())
    out["loss"].backward()  # the recognition network and the latent map both learn
    assert model.recognition.out.weight.grad.abs().sum() > 0
    assert model.backbone.latent_map.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("decomposition", ["none", "cp", "tt"])
def test_given_z_each_joint_is_an_exact_distribution_that_z_changes(decomposition):
    """With z fixed, p(x | x_t, z) is the head's joint exactly as without z: it sums to 1 over all V^L
    sequences and log_prob is that joint's; another z gives another distribution."""
    model = tiny_vadd(decomposition)
    seqs = all_sequences(L, V)
    x_t = torch.full((len(seqs), L), V)
    mask = torch.ones_like(x_t, dtype=torch.bool)
    logps = []
    for seed in (0, 1):
        z = prior_sample(1, K, torch.Generator().manual_seed(seed), "cpu").expand(len(seqs), K)
        with torch.no_grad():
            heads = model(x_t, mask, z=z)
            logp = heads.log_prob(seqs).double()
            joint = heads.joint(x_t)
        assert abs(logp.exp().sum().item() - 1) < 1e-4
        torch.testing.assert_close(joint.log_prob(seqs).double(), logp, atol=1e-4, rtol=1e-4)
        logps.append(logp)
    assert (logps[0] - logps[1]).abs().max() > 1e-3


def test_a_fresh_latent_model_ignores_z_until_trained():
    """The latent map is zero-initialized: a new VADD model is the MDM it would be without z."""
    torch.manual_seed(0)
    model = JointModel(ModelConfig(DiTConfig(vocab_size=V + 1, out_vocab=V, length=L, hidden_dim=16, cond_dim=8,
                                             n_blocks=1, n_heads=2, latent_dim=K)))
    x = torch.full((2, L), V)
    a = model.features(x, z=torch.zeros(2, K))
    b = model.features(x, z=torch.randn(2, K))
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="z is needed"):
        model.features(x)


@pytest.mark.parametrize("ordering", ["random", "top_prob"])
def test_one_step_sampling_draws_from_the_joint_given_each_sequences_z(ordering):
    """All sequences given the same z: one step (every position at once) must follow p(x | all masked, z)."""
    model = tiny_vadd("tt")
    z = prior_sample(1, K, torch.Generator().manual_seed(5), "cpu")
    seqs = all_sequences(L, V)
    with torch.no_grad():
        p = model(torch.full((len(seqs), L), V), torch.ones(len(seqs), L, dtype=torch.bool),
                  z=z.expand(len(seqs), K)).log_prob(seqs).double().exp().numpy()
    run = make_run(model, 20000, 1, seed=0, ordering=ordering)
    run.latent = z.expand(20000, K).clone()
    state = run.step()
    assert state.done and chi_square_pvalue(state.tokens.numpy(), p / p.sum(), seqs.numpy()) > 1e-3


def test_z_comes_from_the_seed_once_and_runs_stay_batch_independent():
    model = tiny_vadd("tt")
    run = make_run(model, 3, 4, seed=7)
    torch.testing.assert_close(run.latent, prior_sample(3, K, Streams.of_request(7, 3), "cpu"))  # its own streams
    first = run.latent.clone()
    while not run.done:
        run.step()
    assert torch.equal(run.latent, first)  # fixed through the steps (VADD's consistency sampler)
    specs = [(3, 4, dict(seed=1)), (2, 3, dict(seed=2, ordering="top_prob")), (2, 4, dict(seed=3))]
    alone = [list(generate(model, n, k, **kw))[-1].tokens for n, k, kw in specs]
    runs = [make_run(model, n, k, **kw) for n, k, kw in specs]
    final = {}
    while live := [r for r in runs if not r.done]:
        for r, state in zip(live, batch_step(model, live).states):
            final[id(r)] = state.tokens
    for lone, r in zip(alone, runs):
        assert torch.equal(lone, final[id(r)])
    other = list(generate(model, 3, 4, seed=8))[-1].tokens  # another seed: another z and other draws
    assert not torch.equal(other, alone[0])


def test_marginal_weight_is_refused_for_a_vadd_model_not_ignored(tmp_path):
    from _loop import fit

    from ttcore.recipes import TrainConfig

    x = torch.randint(0, V, (8, L))
    with pytest.raises(ValueError, match="marginal_weight"):
        fit(tiny_vadd(), None, x, x, TrainConfig(marginal_weight=1.0, compile=False, device="cpu"), tmp_path / "run",
            max_steps=1, quiet=True)
