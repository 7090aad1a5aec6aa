"""Temperature on a joint (docs: concepts, temperature): the step draws from q_T(x, z) ∝ p(x, z | x_t)^(1/T),
the format's joint of the masked tokens x and its latent z (rank 1: none; CP: the component; TT: the path of
hidden states), tempered, and x's marginal. Every reference is enumerated in numpy from the model's raw head
outputs: the tempered joint's marginals and conditionals, its draws (chi-square), T -> 0 (one sequence, the
best (x, z) pair), and the entropy, which falls as T falls (the review: CP's rose, 4.04 -> 4.16 nats; a TT at
T = 0.01 still gave two sequences)."""

import itertools

import numpy as np
import pytest
import torch
from brute import chi_square_pvalue
from tiny import tiny_model

from ttcore.sampling import predetermined_step

V, L = 3, 4
SEQS = np.array(list(itertools.product(range(V), repeat=L)))


def _setting(name: str, rank: int):
    # perturbed so that the joint is neither flat nor nearly deterministic at T = 1 (CP: 4.1 nats, TT: 1.8)
    model = tiny_model(name, V, L, rank, perturb=0.2 if name == "cp" else 0.5, noise=1.0)
    if name == "cp":
        with torch.no_grad():  # distinct mixture weights: an untrained weight head is uniform
            model.head.weights.weight.normal_(0, 1.0)
    x = torch.full((1, L), V)
    masked = x == V
    with torch.no_grad():
        h = model.features(x)
    return model, x, masked, h


def _latent_joint(model, h, name: str) -> np.ndarray:
    """p(x, z) over the masked positions, [v^l, z], from the raw head outputs (normalized here by hand)."""
    with torch.no_grad():
        if name == "none":
            logits = model.head.component_logits(h[0])[:, 0].double().numpy()  # [l, v]
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            return np.array([np.prod([p[i, s[i]] for i in range(L)]) for s in SEQS])[:, None]
        if name == "cp":
            w = torch.softmax(model.head.weight_logits(h).double(), -1)[0].numpy()  # [r]
            f = torch.softmax(model.head.component_logits(h[0]).double(), -1).numpy()  # [l, r, v]
            return np.array([[w[a] * np.prod([f[i, a, s[i]] for i in range(L)]) for a in range(len(w))]
                             for s in SEQS])
        logits = model.head.core_logits(h[0]).double().numpy()  # [l, v, r, r]
    r = logits.shape[-1]
    cores = np.zeros_like(logits)
    for i in range(L):
        for j in range(r):
            row = np.exp(logits[i, :, j, :] - logits[i, :, j, :].max())
            cores[i, :, j, :] = row / row.sum()
    paths = list(itertools.product(range(r), repeat=L + 1))
    return np.array([[np.prod([cores[i, s[i], z[i], z[i + 1]] for i in range(L)]) / r for z in paths]
                     for s in SEQS])


def _tempered(joint: np.ndarray, temperature: float) -> np.ndarray:
    """q_T(x): the latent joint to the power 1/T, normalized, summed over z."""
    q = (joint / joint.max()) ** (1 / temperature)
    return q.sum(1) / q.sum()


def _code_joint(model, x, masked, h, temperature: float) -> np.ndarray:
    """The sampler's joint over the masked positions, by the chain rule of its conditionals (``joint(...)
    .marginals``, as the exact chain-rule step computes them)."""
    dist = model.head_outputs(h, masked).joint(x, temperature)
    p = np.ones(len(SEQS))
    for n, s in enumerate(SEQS):
        cond = torch.full((1, L), -1)
        for i in range(L):
            p[n] *= float(dist.marginals(cond)[0, i, s[i]])
            cond[0, i] = int(s[i])
    return p


CASES = [("none", 1), ("cp", 3), ("tt", 2)]


@pytest.mark.parametrize("name,rank", CASES)
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_the_samplers_joint_and_marginals_are_the_tempered_joints(name, rank, temperature):
    model, x, masked, h = _setting(name, rank)
    want = _tempered(_latent_joint(model, h, name), temperature)
    with torch.no_grad():
        np.testing.assert_allclose(_code_joint(model, x, masked, h, temperature), want, rtol=1e-6, atol=1e-12)
        got = model.format.marginals_at(model.head, h, masked, masked, temperature, "head").numpy()  # [l, v]
    marginals = np.array([[want[SEQS[:, i] == v].sum() for v in range(V)] for i in range(L)])
    np.testing.assert_allclose(got, marginals, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name,rank", CASES)
@pytest.mark.parametrize("contraction", ["head", "exact"])
def test_a_predetermined_step_draws_from_the_tempered_joint(name, rank, contraction):
    """Two of the four positions drawn jointly, the other two summed out of the tempered joint."""
    model, x, masked, h = _setting(name, rank)
    n, chosen = 20000, torch.tensor([[True, False, True, False]])
    q = _tempered(_latent_joint(model, h, name), 0.5)
    outcomes = np.array(list(itertools.product(range(V), repeat=2)))
    p = np.array([q[(SEQS[:, 0] == a) & (SEQS[:, 2] == b)].sum() for a, b in outcomes])
    with torch.no_grad():
        values = predetermined_step(model, h.expand(n, -1, -1), x.expand(n, -1), masked.expand(n, -1),
                                    chosen.expand(n, -1), 0.5, torch.Generator().manual_seed(3), contraction)
    assert chi_square_pvalue(values[:, [0, 2]].numpy(), p, outcomes) > 1e-3


@pytest.mark.parametrize("name,rank", CASES)
def test_temperature_near_zero_gives_the_best_sequence_and_path_every_time(name, rank):
    """At the schema's smallest temperature, 0.01, every draw is one sequence: x of the best (x, z) pair."""
    model, x, masked, h = _setting(name, rank)
    joint = _latent_joint(model, h, name)
    best = SEQS[np.unravel_index(joint.argmax(), joint.shape)[0]]
    n = 200
    with torch.no_grad():
        values = predetermined_step(model, h.expand(n, -1, -1), x.expand(n, -1), masked.expand(n, -1),
                                    masked.expand(n, -1), 0.01, torch.Generator().manual_seed(0), "head")
    assert (values.numpy() == best).all(), np.unique(values.numpy(), axis=0)


@pytest.mark.parametrize("name,rank", CASES)
def test_entropy_falls_as_temperature_falls(name, rank):
    model, x, masked, h = _setting(name, rank)
    entropies = []
    for temperature in (2.0, 1.0, 0.7, 0.5, 0.3, 0.1, 0.03):
        with torch.no_grad():
            p = _code_joint(model, x, masked, h, temperature)
        p = p[p > 0]
        entropies.append(float(-(p * np.log(p)).sum()))
    assert all(a > b or a < 1e-12 for a, b in zip(entropies, entropies[1:])), entropies
    assert entropies[-1] < 0.05 * entropies[0]


def test_the_entropy_of_x_alone_can_rise_as_temperature_falls():
    """What docs/concepts.md says of H(x): tempering (x, z) lowers H(x, z) but can raise H(x). CP, weights 0.3 /
    0.3 / 0.4, V = 2, l = 2, position 0's factors P(x = 0) = 0.1 / 0.2 / 0.8, position 1 uniform: H(x) is
    1.3700 nats at T = 1 and 1.3787 at T = 0.5 (the library's tempered CP, enumerated)."""
    from ttcore.decompositions.cp import cp_tempered_weight_logits

    first = torch.tensor([0.1, 0.2, 0.8], dtype=torch.float64)
    factors = torch.stack([torch.stack([first, 1 - first], -1), torch.full((3, 2), 0.5, dtype=torch.float64)])
    weight_logits = torch.tensor([[0.3, 0.3, 0.4]], dtype=torch.float64).log()
    mask = torch.ones(1, 2, dtype=torch.bool)

    def entropies(temperature: float) -> tuple[float, float]:
        w = torch.softmax(cp_tempered_weight_logits(weight_logits, factors.log(), mask, temperature), -1)[0]
        f = torch.softmax(factors.log() / temperature, -1)  # [l, r, v]
        joint = w[:, None, None] * f[0][:, :, None] * f[1][:, None, :]  # [r, v, v]: q_T(z, x^0, x^1)
        px = joint.sum(0)
        return float(-(joint * joint.log()).sum()), float(-(px * px.log()).sum())

    (hxz_1, hx_1), (hxz_half, hx_half) = entropies(1.0), entropies(0.5)
    assert hxz_half < hxz_1
    assert hx_1 == pytest.approx(1.3700, abs=1e-4) and hx_half == pytest.approx(1.3787, abs=1e-4)
