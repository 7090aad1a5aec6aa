"""Distillation's objectives (``ttcore.distill``) against brute force on tiny models: the student's step
log-likelihood is the law the served step draws from, and the joint objective's optimum is the teacher's joint."""

import itertools

import numpy as np
import pytest
import torch
from brute import chi_square_pvalue
from tiny import tiny_model

from ttcore.distributions import Streams

V, L = 3, 5


def _state(model):
    """One partially known sequence repeated: positions 0 and 3 known, 1, 2, 4 masked; T = {1, 4} (2 between)."""
    mask_id = model.cfg.dit.vocab_size - 1
    x_t = torch.tensor([[1, mask_id, mask_id, 0, mask_id]])
    masked = x_t == mask_id
    chosen = torch.tensor([[False, True, False, False, True]])
    return x_t, masked, chosen


@pytest.mark.parametrize("decomposition,rank", [("none", 1), ("cp", 3), ("tt", 2)])
def test_a_students_step_log_likelihood_is_the_law_the_served_step_draws(decomposition, rank):
    """exp(chosen_log_prob) over every assignment of T sums to 1, and 20,000 draws of the served step
    (``Decomposition.draw``, the head contraction) follow it (chi-square): the objective fits what is served."""
    model = tiny_model(decomposition, V, L, rank, perturb=0.5, noise=0.5)
    fmt, head = model.format, model.head
    x_t, masked, chosen = _state(model)
    with torch.no_grad():
        h = model.features(x_t).float()
        outcomes = np.array(list(itertools.product(range(V), repeat=2)))
        x = x_t.repeat(len(outcomes), 1)
        x[:, 1], x[:, 4] = torch.from_numpy(outcomes[:, 0]), torch.from_numpy(outcomes[:, 1])
        n = len(outcomes)
        logp = fmt.chosen_log_prob(head, h.expand(n, -1, -1), masked.expand(n, -1), chosen.expand(n, -1), x)
        p = logp.double().exp().numpy()
        assert p.sum() == pytest.approx(1.0, abs=1e-5)
        draws = 20_000
        streams = Streams.of_request(7, draws)
        drawn = fmt.draw(head, h.expand(draws, -1, -1), x_t.expand(draws, -1), masked.expand(draws, -1),
                         chosen.expand(draws, -1), 1.0, streams, "head")
    samples = drawn[:, [1, 4]].numpy()
    assert chi_square_pvalue(samples, p, outcomes) > 1e-3


def test_the_joint_objective_fits_a_teachers_joint_that_no_factorized_student_can():
    """A teacher joint over two positions with perfect correlation (x1 = x2, uniform): minimizing the joint
    objective's expected loss (exact over the teacher's outcomes) drives a TT r = 3 student to it (total
    variation < 0.05), while a rank-1 student cannot go below TV 1 - 1/V = 2/3 (its optimum is the product of
    the marginals)."""
    from ttcore.distill import step_log_prob

    target = torch.zeros(V, V)
    target[range(V), range(V)] = 1 / V
    every = torch.tensor(list(itertools.product(range(V), repeat=2)))
    outcomes = every[target[every[:, 0], every[:, 1]] > 0]  # the teacher's support (0 log 0 = 0)
    weights = target[outcomes[:, 0], outcomes[:, 1]]
    results = {}
    for decomposition, rank in (("tt", 3), ("none", 1)):
        model = tiny_model(decomposition, V, 2, rank, perturb=0.1, noise=0.5).train()
        mask_id = model.cfg.dit.vocab_size - 1
        x_t = torch.full((len(outcomes), 2), mask_id)
        chosen = torch.ones_like(x_t, dtype=torch.bool)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        for _ in range(300):
            opt.zero_grad()
            loss = -(weights * step_log_prob(model, x_t, chosen, outcomes)).sum()
            loss.backward()
            opt.step()
        with torch.no_grad():
            q = step_log_prob(model, x_t, chosen, outcomes).exp()  # on the support; the rest is 1 - q.sum()
        results[decomposition] = 0.5 * ((q - weights).abs().sum() + (1 - q.sum())).item()
    assert results["tt"] < 0.05 and results["none"] > 0.6, results


def test_the_teachers_completion_follows_its_enumerated_k_step_law():
    """``teacher_completion`` (what the student is fitted to) draws from the teacher's k-step law: a TT teacher's two
    left-to-right steps from the fully masked state, 20,000 completions against the law enumerated as the product of
    its two steps' exact step laws (``step_log_prob``, itself checked against the served draw above); that law is
    > 0.05 in total variation from the teacher's one-step joint, so a teacher that took one step would fail."""
    from ttcore.distill import step_log_prob, teacher_completion
    from ttcore.sampling import GenerationRun, SamplerConfig

    length, n = 3, 20_000
    teacher = tiny_model("tt", V, length, 2, perturb=0.8, noise=0.8)
    mask_id = teacher.cfg.dit.vocab_size - 1
    config = SamplerConfig(ordering="left_to_right")
    with torch.no_grad():
        done = teacher_completion(teacher, torch.full((n, length), mask_id), torch.zeros(n, dtype=torch.long),
                                  steps=1, k=2, config=config, seed=7)
        run = GenerationRun(teacher, 1, 2, config, seed=0)  # which positions the first of the two steps commits
        run.step()
        first = (run.tokens != mask_id)[0]
        assert 0 < int(first.sum()) < length
        outcomes = torch.tensor(list(itertools.product(range(V), repeat=length)))
        x_t = torch.full_like(outcomes, mask_id)
        after = torch.where(first, outcomes, x_t)  # the state after the first step
        law = (step_log_prob(teacher, x_t, first.expand_as(x_t), outcomes)
               + step_log_prob(teacher, after, (~first).expand_as(x_t), outcomes)).exp().double()
        one_step = step_log_prob(teacher, x_t, torch.ones_like(x_t, dtype=torch.bool), outcomes).exp().double()
    assert abs(law.sum().item() - 1) < 1e-5
    assert 0.5 * (law - one_step).abs().sum().item() > 0.05, "the test cannot tell k steps from one"
    assert (done != mask_id).all()
    p = chi_square_pvalue(done.numpy(), (law / law.sum()).numpy(), outcomes.numpy())
    assert p > 1e-3, p


def test_mixture_terms_against_enumerated_products():
    """``mixture_terms``: log of the mean over components of the product over M, and the sum over M of the log
    mixture marginals, against explicit loops."""
    from ttcore.distill import mixture_terms

    g = torch.Generator().manual_seed(0)
    log_p = torch.randn(2, 3, 4, V, generator=g).log_softmax(-1)
    masked = torch.tensor([[True, False, True, True], [False, True, True, False]])
    y = torch.randint(0, V, (2, 5, 4), generator=g)
    joint, marginals = mixture_terms(log_p, masked, y)
    p = log_p.double().exp()
    for b in range(2):
        for s in range(5):
            at = [d for d in range(4) if masked[b, d]]
            mix = np.mean([np.prod([p[b, m, d, y[b, s, d]].item() for d in at]) for m in range(3)])
            marg = sum(np.log(np.mean([p[b, m, d, y[b, s, d]].item() for m in range(3)])) for d in at)
            assert joint[b, s].item() == pytest.approx(np.log(mix), abs=1e-5)
            assert marginals[b, s].item() == pytest.approx(marg, abs=1e-5)


def test_the_di4c_loss_against_a_direct_computation():
    """``di4c_objective`` on two states against the same loss computed one sequence and one component at a time
    in float64, from the same draws (z at x_t, z at x_s, the composition's uniforms): Di4C's consistency term (the
    teacher's committed tokens, then the student's own mixture at x_s) and data term (alpha(t), the teacher's
    marginals), each with its control variate."""
    from ttcore.distill import DI4C_ALPHA, DI4C_LATENTS, Completion, di4c_objective, mixture_student

    base = tiny_model("none", V, L, 1, perturb=0.5, noise=0.5)
    student = mixture_student(base, 4).train()
    with torch.no_grad():  # components that differ
        student.backbone.latent_map.weight.normal_(generator=torch.Generator().manual_seed(1))
    teacher = tiny_model("none", V, L, 1, perturb=0.8, noise=0.5)
    m = V  # the mask id
    x0 = torch.tensor([[0, 1, 2, 0, 1], [2, 2, 1, 0, 0]])
    x_t = torch.tensor([[0, m, m, 0, m], [m, m, m, m, 0]])
    done = torch.tensor([[0, 2, m, 0, m], [m, 1, m, 0, 0]])
    chosen = (x_t == m) & (done != m)
    with torch.no_grad():
        got = di4c_objective(student, Completion(x_t, done, chosen, x0, teacher, torch.Generator().manual_seed(5)))
    g = torch.Generator().manual_seed(5)
    n, b = DI4C_LATENTS, len(x_t)
    z_t, z_s = torch.randn(b * n, 4, generator=g), torch.randn(b * n, 4, generator=g)
    u = torch.rand(b, n, L, 1, generator=g)

    def probs(model, x, z=None):
        with torch.no_grad():
            h = model.features(x[None]) if z is None else model.features(x[None], z=z[None])
            return model.head.component_logits(h[0])[:, 0].double().softmax(-1).numpy()  # [l, v]

    def kl(q, p):
        return sum(qi * np.log(qi / pi) for qi, pi in zip(q, p) if qi > 0)

    total, tokens = 0.0, 0
    for i in range(b):
        at = [d for d in range(L) if x_t[i, d] == m]
        pt = [probs(student, x_t[i], z_t[i * n + c]) for c in range(n)]
        ps = [probs(student, done[i], z_s[i * n + c]) for c in range(n)]
        mix_marg = {d: np.mean([pt[c][d] for c in range(n)], 0) for d in at}

        def cor(y):
            mix = np.mean([np.prod([pt[c][d, y[d]] for d in at]) for c in range(n)])
            return -np.log(mix) + sum(np.log(mix_marg[d][y[d]]) for d in at)

        draws = []
        for c in range(n):
            y = done[i].tolist()
            for d in range(L):
                if done[i, d] == m:
                    y[d] = int((np.cumsum(ps[c][d]) < u[i, c, d, 0].item()).sum())
            draws.append(y)
        q = {d: (np.mean([ps[c][d] for c in range(n)], 0) if done[i, d] == m else np.eye(V)[int(done[i, d])])
             for d in at}
        consistency = np.mean([cor(y) for y in draws]) + sum(kl(q[d], mix_marg[d]) for d in at)
        teacher_marg = probs(teacher, x_t[i])
        alpha = DI4C_ALPHA / (1 + np.exp(-20 * (len(at) / L - 0.5)))
        data = alpha * cor(x0[i].tolist()) + sum(kl(teacher_marg[d], mix_marg[d]) for d in at)
        total, tokens = total + consistency + data, tokens + len(at)
    assert got["loss"].item() == pytest.approx(total / tokens, rel=1e-4, abs=1e-5)


def test_a_mixture_student_draws_a_new_latent_every_step_from_the_steps_streams():
    """A Di4C student (``latent_draw`` = step): z differs between steps, is a function of (seed, row, step) only,
    and a run's tokens are the same alone and batched with another run."""
    from tiny import run_together

    from ttcore.distill import mixture_student
    from ttcore.sampling import GenerationRun

    student = mixture_student(tiny_model("none", V, L, 1, perturb=0.5, noise=0.5), 4).eval()
    with torch.no_grad():
        student.backbone.latent_map.weight.normal_(generator=torch.Generator().manual_seed(1))
    run = GenerationRun(student, 3, 4, seed=7)
    first = run.step_latent()
    run.step()
    assert not torch.allclose(first, run.step_latent())
    assert torch.equal(run.step_latent(), prior_at(student, 7, 3, 1))
    alone = run_together(student, [GenerationRun(student, 3, 4, seed=7)])[0].tokens
    together = run_together(student, [GenerationRun(student, 2, 3, seed=9), GenerationRun(student, 3, 4, seed=7)])
    assert torch.equal(alone, together[1].tokens)


def prior_at(model, seed: int, rows: int, step: int) -> torch.Tensor:
    """The latent the counter-based streams give ``rows`` sequences of a request at ``step``."""
    from ttcore.models.vadd import prior_sample

    return prior_sample(rows, model.latent_dim, Streams(torch.full((rows,), seed), torch.arange(rows),
                                                         torch.full((rows,), step)), "cpu")


@pytest.mark.parametrize("states", ["student", "teacher", "data"])
def test_a_registered_objective_runs_through_distill_loss_on_the_same_completions(states):
    """A toy objective (half the joint objective) registered by name: ``distill_loss`` draws the same states and
    completions for it as for ``joint`` (the same seeds), so its loss is exactly half; its own rules refuse."""
    from ttcore.distill import (
        OBJECTIVES,
        Objective,
        distill_loss,
        get_objective,
        joint_objective,
        register_objective,
        unregister_objective,
    )
    from ttcore.sampling import SamplerConfig

    def half(student, completion):
        out = joint_objective(student, completion)
        return dict(out, loss=out["loss"] / 2)

    student, teacher = tiny_model("tt", V, L, 2, 0.5, 0.5), tiny_model("tt", V, L, 3, 0.7, 0.7)
    x0 = torch.randint(0, V, (6, L), generator=torch.Generator().manual_seed(0))
    register_objective(Objective("half", half, states=("student", "teacher", "data"), grows=False))
    try:
        def run(name):
            return distill_loss(student, teacher, x0, steps=2, k=2, objective=name, teacher_config=SamplerConfig(),
                                generator=torch.Generator().manual_seed(3), seed=11, states=states)

        joint, halved = run("joint"), run("half")
        assert halved["committed"] == joint["committed"] > 0
        assert torch.equal(halved["loss"], joint["loss"] / 2)
        with pytest.raises(ValueError, match="--student-rank grows a CP / TT student; half's student"):
            get_objective("half").check(states, grown=True)
    finally:
        unregister_objective("half")
    assert list(OBJECTIVES) == ["joint", "marginal", "di4c"]
    with pytest.raises(ValueError, match="--objective di4c fits --states data, got 'student'"):
        get_objective("di4c").check("student", grown=False)
    with pytest.raises(ValueError, match="objective must be one of joint, marginal, di4c"):
        get_objective("half")
