"""EDLM's and DCD's steps (``ttcore.sampling.steps.edlm`` / ``dcd``) against their laws enumerated on tiny models:
a known AR joint (a tiny causal model, its likelihood enumerated) and a known diffusion marginal (a tiny rank-1
model). Each test draws one step of 20,000 sequences from a partly masked state and compares the committed tokens
with the step's distribution computed by brute force (chi-square)."""

import copy
import itertools

import numpy as np
import pytest
import torch
from brute import all_sequences, chi_square_pvalue
from tiny import tiny_ar, tiny_model

from ttcore.distributions import Streams
from ttcore.kinds import pair
from ttcore.kinds.autoregressive import ar_log_prob
from ttcore.sampling import make_run
from ttcore.sampling.steps.dcd import copula_tilts, dcd_step
from ttcore.sampling.steps.edlm import edlm_step

V, L, N = 3, 4, 20_000
MASK = V


@pytest.fixture(scope="module")
def models():
    diffusion = tiny_model("none", V, L, 1, perturb=0.8, noise=0.0)
    ar = tiny_ar(V, L, perturb=0.8)
    return diffusion, ar


def marginals(model, x: torch.Tensor) -> np.ndarray:
    """p_dm(x^i | x) [l, v] of the rank-1 tiny model by its logits (softmax), float64."""
    with torch.no_grad():
        h = model.features(x[None])
        logits = model.head_outputs(h, torch.ones_like(x[None], dtype=torch.bool)).logits
    return torch.softmax(logits.double(), -1).numpy()


def ar_joint(ar) -> tuple[np.ndarray, np.ndarray]:
    seqs = all_sequences(L, V)
    with torch.no_grad():
        p = ar_log_prob(ar, seqs).double().exp().numpy()
    return seqs.numpy(), p


def one_step(step_fn, x: torch.Tensor, chosen: torch.Tensor, **kw) -> np.ndarray:
    xs, cs = x.expand(N, L).clone(), chosen.expand(N, L).clone()
    masked = xs == MASK
    with torch.no_grad():
        return step_fn(xs, masked, cs, Streams.of_request(11, N), **kw).numpy()


@pytest.mark.parametrize("k", [2, 4])
def test_edlm_step_is_sampling_importance_resampling_with_the_ar_energy(models, k):
    diffusion, ar = models
    x = torch.tensor([MASK, 1, MASK, MASK])
    chosen = x == MASK  # the whole masked set: the picked candidate itself
    free = [0, 2, 3]
    q1 = marginals(diffusion, x)
    seqs, p_ar = ar_joint(ar)
    outcomes = np.array(list(itertools.product(range(V), repeat=len(free))))
    q = np.array([np.prod([q1[i, o[j]] for j, i in enumerate(free)]) for o in outcomes])
    full = np.tile(x.numpy(), (len(outcomes), 1))
    full[:, free] = outcomes
    p = np.array([p_ar[(seqs == f).all(1)][0] for f in full])
    w = p / q
    # the law of the pick: k i.i.d. candidates from q, one taken with probability w_j / sum w, enumerated
    law = np.zeros(len(outcomes))
    for combo in itertools.product(range(len(outcomes)), repeat=k):
        pr = np.prod(q[list(combo)])
        ws = w[list(combo)]
        for j, c in enumerate(combo):
            law[c] += pr * ws[j] / ws.sum()

    def step(xs, masked, cs, streams):
        h = diffusion.features(xs)
        return edlm_step(diffusion, ar, h, xs, masked, cs, torch.full((N,), 0.5, dtype=torch.float64), k, 1.0, 1.0,
                         streams)

    draws = one_step(step, x, chosen)
    assert (draws[:, 1] == -1).all() and (draws[:, free] >= 0).all()
    assert chi_square_pvalue(draws[:, free], law, outcomes) > 1e-3
    # and it is not the proposal: the weights move it (the test would pass a plain diffusion step otherwise)
    assert 0.5 * np.abs(law - q).sum() > 0.05


def _sir_law(q: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    """The law of sampling importance resampling: k i.i.d. candidates from q, one kept with probability w_j / sum w."""
    law = np.zeros(len(q))
    for combo in itertools.product(range(len(q)), repeat=k):
        pr, ws = np.prod(q[list(combo)]), w[list(combo)]
        for j, c in enumerate(combo):
            law[c] += pr * ws[j] / ws.sum()
    return law


@pytest.mark.parametrize("fmt, perturb, noise", [("tt", 0.4, 2.0), ("cp", 0.2, 1.0)])  # joints far from their marginals
def test_edlm_over_a_joint_head_resamples_draws_from_its_joint(fmt, perturb, noise):
    """A CP / TT model's EDLM proposals are its joint's own draws, each with its exact likelihood: the step's law
    is importance resampling from the joint (enumerated by the format's distribution, Eq. 6 / 9), not from the
    product of its marginals."""
    from ttcore.sampling.steps.edlm import joint_proposals

    joint = tiny_model(fmt, V, L, 3, perturb=perturb, noise=noise)
    ar = tiny_ar(V, L, perturb=0.8)
    x = torch.tensor([MASK, 1, MASK, MASK])
    chosen = x == MASK
    free = [0, 2, 3]
    outcomes = np.array(list(itertools.product(range(V), repeat=len(free))))
    full = np.tile(x.numpy(), (len(outcomes), 1))
    full[:, free] = outcomes
    with torch.no_grad():
        xs = x.expand(len(outcomes), L)
        dist = joint.head_outputs(joint.features(xs), xs == MASK).joint(xs)
        q = dist.log_prob(torch.tensor(full)).double().exp().numpy()
        marg = np.array([dist.marginals(torch.where(xs == MASK, -1, xs))[0, i].double().numpy() for i in range(L)])
    assert abs(q.sum() - 1) < 1e-6
    seqs, p_ar = ar_joint(ar)
    p = np.array([p_ar[(seqs == f).all(1)][0] for f in full])
    law = _sir_law(q, p / q, 2)
    q_rank1 = np.array([np.prod([marg[i, o[j]] for j, i in enumerate(free)]) for o in outcomes])
    assert 0.5 * np.abs(law - _sir_law(q_rank1, p / q_rank1, 2)).sum() > 0.05  # the joint proposal matters here

    def step(xs, masked, cs, streams):
        return edlm_step(joint, ar, joint.features(xs), xs, masked, cs, torch.full((N,), 0.5, dtype=torch.float64), 2,
                         1.0, 1.0, streams)

    draws = one_step(step, x, chosen)
    assert (draws[:, 1] == -1).all()
    assert chi_square_pvalue(draws[:, free], law, outcomes) > 1e-3

    def rank_one(xs, masked, cs, streams):  # joint: false, exact marginals: resampling from their product
        return edlm_step(joint, ar, joint.features(xs), xs, masked, cs, torch.full((N,), 0.5, dtype=torch.float64), 2,
                         1.0, 1.0, streams, contraction="exact", joint=False)

    draws = one_step(rank_one, x, chosen)
    assert chi_square_pvalue(draws[:, free], _sir_law(q_rank1, p / q_rank1, 2), outcomes) > 1e-3
    assert chi_square_pvalue(draws[:, free], law, outcomes) < 1e-6  # and not the joint's law
    with torch.no_grad():  # each candidate's log q is its exact log-likelihood under the joint
        xs = x.expand(6, L)
        cand, log_q = joint_proposals(joint, joint.features(xs), xs, xs == MASK, 3, Streams.of_request(5, 6), "head")
    index = {tuple(f): n for n, f in enumerate(full.tolist())}
    expected = np.log(q[[index[tuple(c)] for c in cand.reshape(-1, L).tolist()]]).reshape(6, 3)
    assert np.allclose(log_q.numpy(), expected, atol=1e-5)
    assert len({tuple(c) for c in cand.reshape(-1, L).tolist()}) > 1  # the candidates are not one draw repeated


def test_edlm_outside_its_window_is_the_diffusion_step(models):
    diffusion, ar = models
    x = torch.tensor([MASK, MASK, 0, MASK])
    chosen = torch.tensor([True, False, False, True])
    q1 = marginals(diffusion, x)
    outcomes = np.array(list(itertools.product(range(V), repeat=2)))
    law = np.array([q1[0, a] * q1[3, b] for a, b in outcomes])

    def step(xs, masked, cs, streams):
        return edlm_step(diffusion, ar, diffusion.features(xs), xs, masked, cs,
                         torch.full((N,), 0.95, dtype=torch.float64), 2, 0.2, 1.0, streams)

    draws = one_step(step, x, chosen)
    assert chi_square_pvalue(draws[:, [0, 3]], law, outcomes) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # a float64 model keeps its dtype
def test_dcd_step_is_the_tilted_autoregressive_draw(models, dtype):
    diffusion, ar = (copy.deepcopy(m).to(dtype) for m in models)
    x = torch.tensor([MASK, 2, MASK, MASK])
    chosen = torch.tensor([True, False, True, False])  # T = {0, 2}: the AR pass draws 0 and 2 (3 lies past T)
    full = marginals(diffusion, x)
    left0 = marginals(diffusion, torch.tensor([MASK, MASK, MASK, MASK]))[0]  # x_t^{<0}: nothing known
    theta = np.zeros((L, V))
    theta[0] = copula_tilts(torch.tensor(full[0]), torch.tensor(left0)).numpy()  # a known token (2) lies right of 0
    # position 2 has no known token right of it: theta_2 = 0
    seqs, p_ar = ar_joint(ar)
    outcomes = np.array(list(itertools.product(range(V), repeat=2)))
    law = np.zeros(len(outcomes))
    for n, (a, c) in enumerate(outcomes):  # q(a, c) = q0(a) q2(c | a, 2), each the tilted AR conditional
        def conditional(prefix):  # p_AR(x^i = . | prefix) by summing the enumerated joint
            i = len(prefix)
            keep = (seqs[:, :i] == prefix).all(1)
            return np.array([p_ar[keep & (seqs[:, i] == s)].sum() for s in range(V)]) / p_ar[keep].sum()
        t0 = conditional(np.array([])) * np.exp(theta[0])
        t2 = conditional(np.array([a, 2])) * np.exp(theta[2])
        law[n] = t0[a] / t0.sum() * t2[c] / t2.sum()

    def step(xs, masked, cs, streams):
        return dcd_step(diffusion, ar, diffusion.features(xs), xs, masked, cs, 1.0, streams)

    draws = one_step(step, x, chosen)
    assert (draws[:, [1, 3]] == -1).all()
    assert chi_square_pvalue(draws[:, [0, 2]], law, outcomes) > 1e-3
    assert np.abs(theta[0]).max() > 0.05  # the tilt is doing something here


def test_samplers_by_name_need_a_paired_ar_model():
    diffusion = tiny_model("none", V, L, 1, perturb=0.8, noise=0.0)
    with pytest.raises(ValueError, match="paired"):
        make_run(diffusion, 2, 2, sampler="edlm")
    pair(diffusion, tiny_ar(V, L))
    with pytest.raises(ValueError, match="predetermined"):
        make_run(diffusion, 2, 2, sampler="dcd", ordering="entropy")
    assert sum(1 for _ in diffusion.parameters()) == sum(1 for _ in tiny_model("none", V, L, 1, 0.8, 0.0).parameters())
    with pytest.raises(ValueError, match="differ"):
        pair(diffusion, tiny_ar(V + 1, L))


@pytest.mark.parametrize("sampler, fmt", [("edlm", "none"), ("dcd", "none"), ("edlm", "tt")])
def test_runs_finish_and_are_batch_invariant(sampler, fmt):
    from tiny import run_together

    diffusion = tiny_model(fmt, V, L, 1 if fmt == "none" else 3, perturb=0.8, noise=0.5)
    pair(diffusion, tiny_ar(V, L))
    alone = run_together(diffusion, [make_run(diffusion, 6, 2, sampler=sampler, seed=5)])[0].tokens
    together = run_together(diffusion, [make_run(diffusion, 3, 3, seed=1),
                                        make_run(diffusion, 6, 2, sampler=sampler, seed=5)])[1].tokens
    assert (alone != MASK).all() and torch.equal(alone, together)
    small = run_together(diffusion, [make_run(diffusion, 6, 2, sampler=sampler, seed=5, max_rows_per_pass=2)])[0]
    assert torch.equal(alone, small.tokens)  # micro-batches (and the passes they bound) change nothing


def test_a_latent_model_is_refused():
    from ttcore.models import DiTConfig, JointModel, ModelConfig

    torch.manual_seed(0)
    vadd = JointModel(ModelConfig(DiTConfig(vocab_size=V + 1, out_vocab=V, length=L, hidden_dim=16, cond_dim=8,
                                            n_blocks=1, n_heads=2, latent_dim=4))).eval()
    pair(vadd, tiny_ar(V, L))
    with pytest.raises(ValueError, match="without a latent"):
        make_run(vadd, 2, 2, sampler="dcd")


def test_dcd_chunks_unmask_adjacent_positions_together():
    from ttcore.sampling import InvalidSampler, generate

    diffusion = tiny_model("none", V, L, 1, perturb=0.8, noise=0.0)
    pair(diffusion, tiny_ar(V, L))
    states = list(generate(diffusion, 64, 2, sampler="dcd", dcd_chunk=2, seed=7))
    first = states[0].committed  # [64, 4]: one whole chunk of two a step
    assert (first.sum(1) == 2).all()
    assert ((first[:, :2].all(1)) ^ (first[:, 2:].all(1))).all()
    assert 10 < int(first[:, 0].sum()) < 54  # both chunks come first in some sequences (random order of chunks)
    assert (states[-1].tokens != MASK).all()
    for settings in ({"sampler": "edlm", "dcd_chunk": 2}, {"sampler": "dcd", "dcd_chunk": 2, "ordering": "halton"},
                     {"sampler": "dcd", "dcd_chunk": 0}):
        with pytest.raises(InvalidSampler, match="dcd_chunk"):
            make_run(diffusion, 2, 2, **settings)


def test_edlm_over_a_joint_head_reserves_the_memory_of_its_likelihoods():
    """The candidates' exact likelihoods hold every masked position's full head outputs of a piece of rows:
    admission reserves ``cost.summed_outputs_bytes`` for such a step (at least one row's), as for an exact
    contraction; a rank-1 model's EDLM holds none."""
    from ttcore.sampling import SamplerConfig, cost

    tt, cp, rank1 = (tiny_model(f, V, L, r, perturb=0.4, noise=0.5) for f, r in (("tt", 3), ("cp", 3), ("none", 1)))
    edlm = SamplerConfig(sampler="edlm")
    assert edlm.step_kind(tt.cfg) == (False, True) and edlm.step_kind(cp.cfg) == (False, True)
    assert edlm.step_kind(rank1.cfg) == (False, False) and SamplerConfig().step_kind(cp.cfg) == (False, False)
    one_row = 3 * 4 * L * V * cp.format.outputs_per_position(3)
    assert cost.summed_outputs_bytes(cp.cfg) == one_row
    budget = 10 * cost.step_row_bytes(cp.cfg, False) + one_row
    assert cost.rows_per_pass(cp.cfg, False, budget, True) == 10  # what is left after the reserve
