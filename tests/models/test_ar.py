"""The autoregressive model (``ttcore.kinds.autoregressive``): its likelihood is a normalized distribution equal to the
product of its conditionals, each position sees only the tokens before it, and its generation (the denoising
loop, one token a step, left to right) draws exactly from it."""

import pytest
import torch
from brute import all_sequences, chi_square_pvalue
from tiny import tiny_ar

from ttcore.kinds.autoregressive import ar_conditionals, ar_log_prob
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.sampling import generate

V, L = 3, 3


def test_likelihood_normalized_and_equal_to_its_conditionals():
    model = tiny_ar(V, L)
    seqs = all_sequences(L, V)
    with torch.no_grad():
        logp = ar_log_prob(model, seqs).double()
        cond = ar_conditionals(model, seqs).double()
    assert abs(logp.exp().sum().item() - 1) < 1e-5
    chained = cond.gather(-1, seqs[..., None])[..., 0].sum(1)
    assert torch.allclose(logp, chained, atol=1e-5)
    # the conditional at i depends on x^{<i} only: sequences that agree before i have equal conditionals there
    for i in range(L):
        for prefix in {tuple(s[:i].tolist()) for s in seqs}:
            rows = cond[(seqs[:, :i] == torch.tensor(prefix, dtype=torch.long)).all(1), i]
            assert torch.allclose(rows, rows[:1].expand_as(rows), atol=1e-6)


def test_generation_draws_from_the_model():
    model = tiny_ar(V, L)
    seqs = all_sequences(L, V)
    with torch.no_grad():
        p = ar_log_prob(model, seqs).double().exp().numpy()
    *_, last = generate(model, 20_000, L, ordering="left_to_right", seed=3)
    assert chi_square_pvalue(last.tokens.numpy(), p / p.sum(), seqs.numpy()) > 1e-3
    # a prefix prompt: the completion's law is p(x^2 | x^0, x^1)
    prompt = torch.tensor([1, 0, V])
    *_, last = generate(model, 5_000, L, ordering="left_to_right", seed=4, prompt=prompt)
    keep = (seqs[:, :2] == prompt[:2]).all(1).numpy()
    q = p[keep] / p[keep].sum()
    assert (last.tokens[:, :2] == prompt[:2]).all()
    assert chi_square_pvalue(last.tokens.numpy(), q, seqs.numpy()[keep]) > 1e-3


@pytest.mark.parametrize("settings, steps, prompt, message", [
    ({"ordering": "random"}, L, None, "left to right"),
    ({"ordering": "left_to_right"}, L - 1, None, "steps must be >= 3"),
    ({"ordering": "left_to_right"}, L, torch.tensor([V, 1, V]), "prefix only"),
    ({"ordering": "left_to_right", "eb_gamma": 0.1}, L, None, "one token a step"),
    ({"ordering": "left_to_right", "schedule": "cosine"}, 2 * L, None, "schedule must be 'loglinear'"),
    ({"ordering": "left_to_right", "bernoulli": True}, 2 * L, None, "without bernoulli"),
])
def test_refuses_what_it_cannot_draw_exactly(settings, steps, prompt, message):
    if "schedule" in settings or "bernoulli" in settings:  # what the refusal prevents: two tokens in one step
        from ttcore.sampling.schedules import SCHEDULES, unmask_counts

        n = torch.tensor([L])
        counts = [unmask_counts(n, n, steps, k, SCHEDULES[settings.get("schedule", "loglinear")]) for k in range(steps)]
        assert settings.get("bernoulli") or max(int(c) for c in counts) > 1
    with pytest.raises(ValueError, match=message):
        next(generate(tiny_ar(V, L), 2, steps, prompt=prompt, **settings))


def test_finetuning_refuses_an_autoregressive_base():
    with pytest.raises(ValueError, match="autoregressive"):
        JointModel.from_base(tiny_ar(V, L), "tt", 2)
    with pytest.raises(ValueError, match="rank-1 head"):
        ModelConfig(DiTConfig(vocab_size=4, out_vocab=3, length=3, causal=True), decomposition="tt", rank=2)


def test_ar_score_is_the_exact_conditional_of_a_suffix():
    from ttcore.kinds.autoregressive import ar_score

    model = tiny_ar(V, L)
    seqs = all_sequences(L, V)
    with torch.no_grad():
        p = ar_log_prob(model, seqs).double().exp()
        mask = torch.tensor([False, True, True]).expand_as(seqs)
        log_p, token = ar_score(model, seqs, mask)
    prefix_mass = torch.stack([p[seqs[:, 0] == s[0]].sum() for s in seqs])
    assert torch.allclose(log_p, (p / prefix_mass).log(), atol=1e-5)  # log p(x^1, x^2 | x^0), enumerated
    assert token[:, 0].isnan().all() and torch.allclose(token[:, 1:].sum(1), log_p)
    with pytest.raises(ValueError, match="suffix"):
        ar_score(model, seqs, torch.tensor([True, False, True]).expand_as(seqs))
