"""The generation loop against exact distributions (chi-square at fixed seeds)."""

import itertools

import numpy as np
import pytest
import torch
from brute import all_sequences, chi_square_pvalue, dense_cp, dense_tt
from explicit import ExplicitCP, ExplicitTT, PerfectMarginals
from scipy import stats
from tiny import tiny_model

from ttcore.distributions import TensorTrain
from ttcore.sampling import GenerationRun, SamplerConfig, batch_step, generate, make_run

V, L, R, N = 3, 4, 3, 20000


def _tt_cores(seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorTrain.from_logits(2 * torch.randn(1, L, V, R, R, generator=g, dtype=torch.float64)).cores[0]


def _final(model, steps, **kw):
    *_, last = generate(model, N, steps, seed=kw.pop("seed", 0), **kw)
    assert last.done and (last.tokens < V).all()
    return last.tokens.numpy()


@pytest.mark.parametrize("path", ["fast", "exact"])  # adaptive orderings: the fast path and the chain rule
@pytest.mark.parametrize("ordering", ["random", "left_to_right", "halton", "top_prob", "margin", "entropy"])
def test_one_step_generation_is_distributed_as_the_tt(ordering, path):
    cores = _tt_cores()
    seqs = all_sequences(L, V).numpy()
    p = dense_tt(cores.numpy(), seqs)
    draws = _final(ExplicitTT(cores), 1, ordering=ordering, adaptive_path=path)
    assert chi_square_pvalue(draws, p, seqs) > 1e-3


def test_the_tt_draw_reading_core_rows_a_position_at_a_time_has_the_same_law():
    """The draw's core rows computed at each chosen position when its state is drawn (a large head's way), not
    for all chosen positions at once (a small head's): the TT's law at one step, and at one and two steps the
    same tokens from the same streams."""
    cores = _tt_cores()
    seqs = all_sequences(L, V).numpy()
    draws = _final(ExplicitTT(cores, all_at_once=False), 1, ordering="random")
    assert chi_square_pvalue(draws, dense_tt(cores.numpy(), seqs), seqs) > 1e-3
    for steps in (1, 2):
        assert (_final(ExplicitTT(cores, all_at_once=False), steps, ordering="random")
                == _final(ExplicitTT(cores), steps, ordering="random")).all()


@pytest.mark.parametrize("path", ["fast", "exact"])
@pytest.mark.parametrize("ordering", ["random", "entropy"])
def test_one_step_generation_is_distributed_as_the_cp(ordering, path):
    g = torch.Generator().manual_seed(3)
    w = torch.softmax(torch.randn(R, generator=g, dtype=torch.float64), -1)
    f = torch.softmax(2 * torch.randn(L, R, V, generator=g, dtype=torch.float64), -1)
    seqs = all_sequences(L, V).numpy()
    draws = _final(ExplicitCP(w, f), 1, ordering=ordering, adaptive_path=path)
    assert chi_square_pvalue(draws, dense_cp(w.numpy(), f.numpy(), seqs), seqs) > 1e-3


@pytest.mark.parametrize("ordering", ["random", "entropy"])
def test_micro_batched_generation_is_still_distributed_as_the_tt(ordering):
    """Sequences drawn in passes of 1500 (a memory budget) are still exact joint draws."""
    cores = _tt_cores(4)
    seqs = all_sequences(L, V).numpy()
    draws = _final(ExplicitTT(cores), 1, ordering=ordering, max_rows_per_pass=1500)
    assert chi_square_pvalue(draws, dense_tt(cores.numpy(), seqs), seqs) > 1e-3
    again = _final(ExplicitTT(cores), 1, ordering=ordering, max_rows_per_pass=1500)
    assert (draws == again).all()  # deterministic for a given pass size


@pytest.mark.parametrize("path", ["fast", "exact"])
def test_eb_step_with_unbounded_gamma_is_one_exact_joint_draw(path):
    cores = _tt_cores(1)
    seqs = all_sequences(L, V).numpy()
    draws = _final(ExplicitTT(cores), 4, eb_gamma=1e9, adaptive_path=path)
    assert chi_square_pvalue(draws, dense_tt(cores.numpy(), seqs), seqs) > 1e-3


def test_two_step_predetermined_with_contracted_head_matches_enumeration():
    """Step 1 draws a uniformly random pair T from the TT marginal (contracted cores elsewhere);
    step 2 draws the rest from the TT whose T cores are delta * I. Enumerate that exactly."""
    cores = _tt_cores(2).numpy()
    seqs = all_sequences(L, V).numpy()
    eye = np.eye(R)
    p = np.zeros(len(seqs))
    subsets = list(itertools.combinations(range(L), 2))
    for t1 in subsets:
        for k, s in enumerate(seqs):
            vec1, vec2 = np.ones(R) / R, np.ones(R) / R
            for i in range(L):
                vec1 = vec1 @ (cores[i, s[i]] if i in t1 else cores[i].sum(0))
                vec2 = vec2 @ (eye if i in t1 else cores[i, s[i]])
            p[k] += vec1.sum() * vec2.sum() / len(subsets)
    model = ExplicitTT(torch.from_numpy(cores))
    draws = _final(model, 2, ordering="random")
    assert chi_square_pvalue(draws, p, seqs) > 1e-3
    assert model.calls == 2


def _mdlm_reference(model: PerfectMarginals, n: int, steps: int, seed: int) -> np.ndarray:
    """MDLM's ancestral sampler, written out plainly: from t to s every masked token is revealed
    with probability (t - s) / t, its value drawn from p(x^i | x_t)."""
    rng = np.random.default_rng(seed)
    x = np.full((n, L), V)
    for k in range(steps):
        t, s = 1 - k / steps, 1 - (k + 1) / steps
        probs = model.conditional_marginals(torch.from_numpy(x)).numpy()  # [n, L, V]
        reveal = (x == V) & (rng.random((n, L)) < (t - s) / t)
        cdf = probs.cumsum(-1)
        values = (rng.random((n, L, 1)) > cdf).sum(-1).clip(max=V - 1)
        x = np.where(reveal, values, x)
    return x


@pytest.mark.parametrize("steps", [2, 3])
def test_rank_one_random_order_matches_mdlm_sampler(steps):
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(2.5 * torch.randn(V ** L, generator=g, dtype=torch.float64), 0)
    model = PerfectMarginals(p, V, L)
    ours = _final(model, steps, ordering="random", bernoulli=True, seed=5)
    ref = _mdlm_reference(model, N, steps, seed=6)
    index = {tuple(s): k for k, s in enumerate(all_sequences(L, V).numpy())}
    table = np.zeros((2, V ** L))
    for row, draws in enumerate((ours, ref)):
        for d in draws:
            table[row, index[tuple(d)]] += 1
    keep = table.sum(0) >= 10
    rare = table[:, ~keep].sum(1, keepdims=True)
    table = np.concatenate([table[:, keep]] + ([rare] if rare.sum() > 0 else []), 1)
    assert stats.chi2_contingency(table).pvalue > 1e-3
    # and parallel sampling is biased: the output is not P itself (the test can fail)
    seqs = all_sequences(L, V).numpy()
    assert chi_square_pvalue(ours, p.numpy(), seqs) < 1e-6


def _tiny_model(decomposition="tt"):
    return tiny_model(decomposition, 8, 10, 3, perturb=0.5, noise=0.3)


SETTINGS = [dict(ordering="random"), dict(ordering="halton"), dict(ordering="top_prob"),
            dict(ordering="top_prob", adaptive_path="exact"), dict(ordering="margin", schedule="cosine"),
            dict(eb_gamma=0.3), dict(eb_gamma=0.3, adaptive_path="exact"),
            dict(ordering="left_to_right", schedule="linear")]


@pytest.mark.parametrize("decomposition", ["none", "cp", "tt"])
@pytest.mark.parametrize("settings", SETTINGS)
def test_same_seed_same_output_and_prompt_kept(decomposition, settings):
    model = _tiny_model(decomposition)
    prompt = torch.full((10,), 8)
    prompt[[0, 3, 4]] = torch.tensor([2, 5, 0])
    a = list(generate(model, 6, 4, seed=7, prompt=prompt, **settings))
    b = list(generate(model, 6, 4, seed=7, prompt=prompt, **settings))
    c = list(generate(model, 6, 4, seed=8, prompt=prompt, **settings))
    assert torch.equal(a[-1].tokens, b[-1].tokens)
    assert not torch.equal(a[-1].tokens, c[-1].tokens)
    assert a[-1].done and (a[-1].tokens < 8).all()
    committed = torch.zeros(6, 10, dtype=torch.bool)
    for s in a:
        assert (s.tokens[:, [0, 3, 4]] == torch.tensor([2, 5, 0])).all()
        assert not (s.committed & committed).any()  # every position committed once
        committed |= s.committed
    assert (committed == (prompt == 8)).all()


def test_step_counts_and_model_calls():
    model = _tiny_model("none")
    states = list(generate(model, 2, 4, seed=0))
    assert [int(s.committed[0].sum()) for s in states] == [2, 3, 3, 2]  # 10 - 7.5 - 5 - 2.5 - 0, rounded half-even
    assert [s.model_calls for s in states] == [1, 2, 3, 4]
    many = list(generate(model, 2, 25, seed=0))  # K >= l: one token per step, idle steps call nothing
    assert all(int(s.committed[0].sum()) <= 1 for s in many)
    assert many[-1].model_calls == 10 and many[-1].done


def test_invalid_settings_are_refused():
    model = _tiny_model("none")
    for kw, msg in [(dict(ordering="sideways"), "ordering must be one of"), (dict(temperature=0), "temperature"),
                    (dict(eb_gamma=-1), "eb_gamma"), (dict(prompt=torch.zeros(3, dtype=torch.long)), "prompt")]:
        with pytest.raises(ValueError, match=msg):
            make_run(model, 2, 4, **kw)


@pytest.mark.parametrize("decomposition", ["none", "cp", "tt"])
def test_runs_stepped_together_equal_lone_runs(decomposition):
    """batch_step (the engine's loop body: one forward, then step_together) shares one joint draw among
    predetermined and fast-adaptive runs of equal temperature; every run must still produce, step by step,
    exactly what it produces alone (its own random stream)."""
    model = _tiny_model(decomposition)
    prompt = torch.full((10,), 8)
    prompt[[1, 6]] = torch.tensor([3, 4])
    specs = [(3, 4, dict(seed=1, ordering="random")), (2, 25, dict(seed=2, ordering="random")),
             (4, 2, dict(seed=3, ordering="left_to_right", prompt=prompt)), (1, 6, dict(seed=4, ordering="halton")),
             (2, 4, dict(seed=5, ordering="random", temperature=0.7)),
             (2, 3, dict(seed=6, ordering="top_prob", adaptive_path="exact")),
             (3, 5, dict(seed=7, eb_gamma=0.3, adaptive_path="exact")),
             (2, 8, dict(seed=8, ordering="random", temperature=0.7)),
             (5, 4, dict(seed=9, ordering="random", max_rows_per_pass=2)),  # alone in passes of 2
             (3, 4, dict(seed=10, ordering="random", max_rows_per_pass=4)),  # shares passes of at most 4
             (2, 4, dict(seed=11, ordering="top_prob", max_rows_per_pass=1, adaptive_path="exact")),
             # the fast adaptive path: each run chooses alone, then shares the draw
             (2, 4, dict(seed=12, ordering="top_prob", adaptive_path="fast")),
             (3, 5, dict(seed=13, eb_gamma=0.3, adaptive_path="fast")),
             (2, 3, dict(seed=14, ordering="entropy", adaptive_path="fast", temperature=0.7)),
             (3, 4, dict(seed=15, ordering="margin", adaptive_path="fast", max_rows_per_pass=2))]
    alone = [list(generate(model, n, k, **kw)) for n, k, kw in specs]
    runs = [make_run(model, n, k, **kw) for n, k, kw in specs]
    together = [[] for _ in runs]
    while not all(run.done for run in runs):
        live = [i for i, run in enumerate(runs) if not run.done]
        for i, state in zip(live, batch_step(model, [runs[i] for i in live]).states):
            together[i].append(state)
    for lone, batched in zip(alone, together):
        assert len(lone) == len(batched)
        for a, b in zip(lone, batched):
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.committed, b.committed)
            assert (a.step, a.model_calls, a.done) == (b.step, b.model_calls, b.done)


@pytest.mark.parametrize("decomposition", ["cp", "tt"])
@pytest.mark.parametrize("ordering", ["random", "left_to_right", "halton", "top_prob", "margin", "entropy"])
def test_joint_models_unmask_one_token_per_step_when_k_ge_l(decomposition, ordering):
    model = _tiny_model(decomposition)
    states = list(generate(model, 3, 25, seed=0, ordering=ordering))
    per_step = torch.stack([s.committed.sum(1) for s in states])  # [steps, b]
    assert (per_step <= 1).all() and (per_step.sum(0) == 10).all()
    assert states[-1].model_calls == 10 and states[-1].done and (states[-1].tokens < 8).all()


@pytest.mark.parametrize("ordering", ["random", "entropy"])
def test_joint_false_draws_each_position_from_the_exact_marginals(ordering):
    """The rank-1 view of a TT: one step draws from the product of its exact marginals, not the TT."""
    cores = _tt_cores(5)
    seqs = all_sequences(L, V).numpy()
    p = dense_tt(cores.numpy(), seqs)
    marginals = np.stack([np.bincount(seqs[:, i], weights=p, minlength=V) for i in range(L)])  # [l, v]
    product = np.prod(marginals[np.arange(L), seqs], axis=1)
    draws = _final(ExplicitTT(cores), 1, ordering=ordering, joint=False)
    assert chi_square_pvalue(draws, product, seqs) > 1e-3
    assert chi_square_pvalue(draws, p, seqs) < 1e-6  # and it is not the joint


def test_joint_false_is_refused_with_eb():
    with pytest.raises(ValueError, match="fixed sampler"):
        make_run(ExplicitTT(_tt_cores()), 2, 4, eb_gamma=0.5, joint=False)


def _entropy_np(q):
    q = q[q > 0]
    return float(-(q * np.log(q)).sum())


@pytest.mark.parametrize("ordering", ["top_prob", "entropy"])
def test_the_fast_adaptive_path_draws_its_set_jointly_from_the_tt(ordering):
    """adaptive_path="fast", 2 steps: step 1 draws the 2 best positions T by the enumerated marginals jointly
    from the TT (the others contracted), step 2 the rest from the TT whose T cores are delta * I (the
    explicit model's known positions); the enumeration of exactly that is the target (chi-square)."""
    cores = _tt_cores(4).numpy()
    seqs = all_sequences(L, V).numpy()
    p_tt = dense_tt(cores, seqs)
    marg = np.stack([[p_tt[seqs[:, i] == x].sum() for x in range(V)] for i in range(L)])  # [l, v]
    score = marg.max(1) if ordering == "top_prob" else -np.array([_entropy_np(m) for m in marg])
    t1 = set(np.argsort(-score, kind="stable")[:2].tolist())
    eye, p = np.eye(R), np.zeros(len(seqs))
    for k, s in enumerate(seqs):
        vec1, vec2 = np.ones(R) / R, np.ones(R) / R
        for i in range(L):
            vec1 = vec1 @ (cores[i, s[i]] if i in t1 else cores[i].sum(0))
            vec2 = vec2 @ (eye if i in t1 else cores[i, s[i]])
        p[k] = vec1.sum() * vec2.sum()
    draws = _final(ExplicitTT(torch.from_numpy(cores)), 2, ordering=ordering, adaptive_path="fast")
    assert chi_square_pvalue(draws, p, seqs) > 1e-3


def test_the_fast_eb_step_with_unbounded_gamma_is_one_exact_joint_draw():
    cores = _tt_cores(1)
    seqs = all_sequences(L, V).numpy()
    draws = _final(ExplicitTT(cores), 4, eb_gamma=1e9, adaptive_path="fast")
    assert chi_square_pvalue(draws, dense_tt(cores.numpy(), seqs), seqs) > 1e-3


def test_the_fast_path_chooses_the_best_positions_by_the_exact_marginals():
    cores = _tt_cores(5)
    seqs = all_sequences(L, V).numpy()
    p = dense_tt(cores.numpy(), seqs)
    marg = np.stack([[p[seqs[:, i] == x].sum() for x in range(V)] for i in range(L)])  # [l, v], enumerated
    run = make_run(ExplicitTT(cores), 8, 2, seed=0, ordering="top_prob", adaptive_path="fast")
    state = run.step()
    want = set(np.argsort(-marg.max(1), kind="stable")[:2].tolist())  # the two most confident positions
    assert all(set(row.nonzero().flatten().tolist()) == want for row in state.committed)
    eb = make_run(ExplicitTT(cores), 4, 4, seed=0, eb_gamma=0.0, adaptive_path="fast")
    assert all(int(row.sum()) == 1 for row in eb.step().committed)  # gamma 0: one token a step
    assert run.sampler.chooses and not run.sampler.adaptive and type(run.sampler).__name__ == "FastAdaptiveStep"
    with pytest.raises(ValueError, match="adaptive_path"):
        make_run(ExplicitTT(cores), 1, 1, adaptive_path="approximate")


@pytest.mark.parametrize("fmt", ["tt", "cp"])
def test_component_weights_mix_the_head_outputs_into_the_enumerated_marginals(fmt):
    """Decomposition.component_weights (what the fast step chooses by): sum_e w_e softmax(output e) is each
    position's single-position marginal, against enumeration of the whole joint (TT, CP)."""
    from ttcore.sampling.steps.fast_adaptive import chooser_marginals

    seqs = all_sequences(L, V).numpy()
    if fmt == "tt":
        cores = _tt_cores(6)
        model, p = ExplicitTT(cores), dense_tt(cores.numpy(), seqs)
    else:
        g = torch.Generator().manual_seed(6)
        w = torch.softmax(torch.randn(R, generator=g, dtype=torch.float64), -1)
        f = torch.softmax(2 * torch.randn(L, R, V, generator=g, dtype=torch.float64), -1)
        model, p = ExplicitCP(w, f), dense_cp(w.numpy(), f.numpy(), seqs)
    marg = np.stack([[p[seqs[:, i] == x].sum() for x in range(V)] for i in range(L)])  # [l, v]
    x = torch.full((1, L), V)
    masked = torch.ones(1, L, dtype=torch.bool)
    h = model.features(x)
    weights = model.format.component_weights(model.head, h, masked, 1.0)
    assert weights.shape == (L, R * R if fmt == "tt" else R)
    assert torch.allclose(weights.sum(-1), torch.ones(L, dtype=weights.dtype))
    got = chooser_marginals(model, h, masked, 1.0).double().numpy()  # [l, v]; c = E here: every output
    assert np.allclose(got, marg, atol=1e-6)


def test_the_fast_path_at_one_output_per_position_chooses_by_the_heaviest_output(monkeypatch):
    """With c = 1 (text size: V-sized outputs cost what a rank-1 step does) each masked position is scored by
    its heaviest output alone, w_(j,k) = pi_j Gbar_jk, enumerated here from the cores."""
    from ttcore.sampling.steps import fast_adaptive

    monkeypatch.setattr(fast_adaptive, "CHOOSER_OUTPUTS", 1)
    cores = _tt_cores(7).numpy()  # [l, v, r, r]
    pi, scores = np.ones(R) / R, []
    for i in range(L):
        gbar = cores[i].sum(0)
        w = pi[:, None] * gbar
        j, k = np.unravel_index(np.argmax(w), w.shape)
        q = cores[i, :, j, k] / cores[i, :, j, k].sum()
        scores.append(q.max())
        pi = pi @ gbar
    want = set(np.argsort(-np.array(scores), kind="stable")[:2].tolist())
    run = make_run(ExplicitTT(torch.from_numpy(cores)), 8, 2, seed=0, ordering="top_prob", adaptive_path="fast")
    assert all(set(row.nonzero().flatten().tolist()) == want for row in run.step().committed)


@pytest.mark.parametrize("fmt", ["tt", "cp"])
def test_the_chooser_is_within_its_dropped_weight_of_the_full_mixture(fmt):
    """The fast step's chooser at c outputs is the renormalized mixture of the c heaviest: its total variation to
    the mixture of every output is at most the weight it dropped (the bound the docs state), for every c, on a
    real tiny model with random weights (TT r = 3: E = 9; CP r = 5)."""
    from ttcore.sampling.steps.fast_adaptive import chooser_marginals

    model = tiny_model(fmt, 6, 7, 3 if fmt == "tt" else 5, perturb=0.5, noise=0.8)
    x = torch.full((4, 7), 6)
    x[:, :2] = torch.tensor([1, 4])
    masked = x == 6
    with torch.no_grad():
        h = model.features(x)
        weights = model.format.component_weights(model.head, h, masked, 1.0)
        e = weights.shape[1]
        full = chooser_marginals(model, h, masked, 1.0, outputs=e).double()
        for c in range(1, e):
            dropped = 1 - weights.topk(c, -1).values.sum(-1)
            tv = 0.5 * (chooser_marginals(model, h, masked, 1.0, outputs=c).double() - full).abs().sum(-1)
            assert torch.all(tv <= dropped + 1e-5), (c, tv, dropped)
            assert c > 1 or tv.max() > 1e-3  # the test can fail: one output is not the mixture


@pytest.mark.parametrize("settings", [dict(temperature=0.7), dict(contraction="exact")])
def test_where_the_tt_step_sums_its_cores_the_chooser_is_the_exact_tempered_marginal(settings):
    """The review: at temperature 0.7 the chooser's weights stayed at temperature 1 (0.12 off with a perfect
    head), and with contraction exact it still used the head. Where the predetermined step sums the cores (these
    settings), the chooser is the exact marginal of the (tempered) TT that step draws from, against enumeration."""
    from ttcore.sampling.steps.fast_adaptive import chooser_marginals

    v, l = 3, 4
    model = tiny_model("tt", v, l, 2, perturb=0.5, noise=0.8)
    temperature = settings.get("temperature", 1.0)
    x = torch.tensor([[v, 1, v, v]])
    masked = x == v
    seqs = all_sequences(l, v)
    with torch.no_grad():
        h = model.features(x)
        joint = model.head_outputs(h, masked).joint(x, temperature)
        p = torch.stack([joint.log_prob(s[None]).exp()[0] for s in seqs if s[1] == 1]).double()
        kept = torch.stack([s for s in seqs if s[1] == 1])
        want = torch.stack([torch.stack([p[kept[:, i] == t].sum() for t in range(v)]) for i in (0, 2, 3)])
        got = chooser_marginals(model, h, masked, temperature, contraction=settings.get("contraction", "head"))
        head = chooser_marginals(model, h, masked, 1.0, outputs=4)  # the head's mixture: not exact
    assert torch.allclose(got.double(), want / want.sum(-1, keepdim=True), atol=1e-5)
    assert settings.get("contraction") == "exact" or (head.double() - want).abs().max() > 1e-3


def test_chooser_outputs_is_a_setting_that_admission_prices():
    """``chooser_outputs`` (c) is the request's: the step evaluates c outputs, and the memory a step holds grows
    with it (a text-sized TT: c = 16 holds 16 V-sized outputs per position)."""
    from ttcore.sampling import SamplerConfig, cost
    from ttcore.sampling.config import InvalidSampler

    model = tiny_model("tt", 6, 7, 4, perturb=0.1, noise=0.1)
    one = cost.rows_for(model, 1 << 30, ordering="top_prob", adaptive_path="fast", chooser_outputs=1)
    all16 = cost.rows_for(model, 1 << 30, ordering="top_prob", adaptive_path="fast", chooser_outputs=16)
    assert one > all16 > 0
    with pytest.raises(InvalidSampler, match="chooser_outputs"):
        SamplerConfig(chooser_outputs=0)


@pytest.mark.parametrize("settings", [{}, {"schedule": "cosine"}, {"ordering": "top_prob", "adaptive_path": "fast"},
                                      {"bernoulli": True}, {"ordering": "top_prob", "adaptive_path": "fast",
                                                            "eb_gamma": 0.5}])
def test_skipping_idle_steps_changes_no_token_and_leaves_at_most_one_step_per_position(settings):
    """The review: 1,024 steps of QM9's 22 positions cost the service 1,024 engine iterations (0.7 ms each) for
    22 steps that unmask anything. ``skip_idle_steps`` passes the steps the schedule leaves empty: the tokens
    are those of the run that takes every step, and a deterministic schedule leaves at most l steps to run per
    distinct masked count
    (coins and EB's bound decide their counts by drawing: nothing is skipped there)."""
    model = tiny_model("tt", 6, 7, 4, perturb=0.1, noise=0.1)
    l = model.cfg.dit.length
    prompt = torch.full((3, l), model.cfg.dit.vocab_size - 1)
    prompt[1, :2] = 0  # a sequence with fewer masked positions steps on its own schedule
    for steps in (3, l, 40):
        every, skipping = (GenerationRun(model, 3, steps, SamplerConfig(**settings), seed=5, prompt=prompt)
                           for _ in range(2))
        every_ran = 0
        while not every.done:
            every.step()
            every_ran += 1
        ran = 0
        while not skipping.done:
            skipping.skip_idle_steps()
            skipping.step()
            ran += 1
        assert torch.equal(every.tokens, skipping.tokens), (settings, steps)
        deterministic = not settings.get("bernoulli") and "eb_gamma" not in settings
        # at most one step per position of each distinct masked count (l and l - 2 here); none skipped by draws
        assert ran <= 2 * l - 2 if deterministic else ran == every_ran, (settings, steps, ran)
        assert ran < every_ran or not deterministic or steps <= l
