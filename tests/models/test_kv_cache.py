"""The autoregressive model's key-value cache (``ttcore.models.kv_cache``): a decoded position's features equal the
full forward's there, generation draws the same tokens with and without it (alone, batched, runs joining late,
a cache dropped), and a step of many runs makes at most two backbone calls."""

import torch
from tiny import run_together, tiny_ar

from ttcore.kinds import pair
from ttcore.models.kv_cache import cached_features, first_masked, prefill
from ttcore.sampling import GenerationRun, SamplerConfig, batch_step

V, L = 5, 7
LTR = SamplerConfig(ordering="left_to_right")


def _model():
    return tiny_ar(V, L).double()


@torch.no_grad()
def test_decoded_features_equal_the_full_forward():
    model = _model()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (4, L), generator=g)
    known = torch.tensor([0, 1, 3, L])  # each row's prefix: a fully masked row, ..., a finished one
    x[torch.arange(L)[None] >= known[:, None]] = V
    h, cache = prefill(model, x)
    assert torch.equal(cache.filled, (known + 1).clamp_max(L))
    assert torch.allclose(h, model.features(x), atol=1e-12)
    for _ in range(L):  # fill each row's first masked position, then compute the next one from the cache
        pos = first_masked(x, V)
        live = pos < L
        x[live, pos[live]] = torch.randint(0, V, (int(live.sum()),), generator=g)
        h, caches = cached_features(model, [cache], [4], x)
        cache = caches[0]
        full = model.features(x)
        at = first_masked(x, V)
        rows = (at < L).nonzero()[:, 0]
        assert torch.allclose(h[rows, at[rows]], full[rows, at[rows]], atol=1e-12)
    k, v = cache.layers[0]
    _, fresh = prefill(model, x)  # the cache holds what a prefill of the finished rows computes
    assert torch.allclose(k, fresh.layers[0][0], atol=1e-12) and torch.allclose(v, fresh.layers[0][1], atol=1e-12)


def _runs(model, kv_cache: bool, steps: int = L + 2, seeds=(1, 2, 3)):
    prompts = [None, torch.tensor([2, 4] + [V] * (L - 2)),
               torch.tensor([[1] + [V] * (L - 1), [3, 3, 0] + [V] * (L - 3)])]  # rows of one run at two positions
    return [GenerationRun(model, 2, steps, LTR, seed=s, prompt=p, kv_cache=kv_cache) for s, p in zip(seeds, prompts)]


@torch.no_grad()
def test_generation_is_the_same_with_and_without_the_cache():
    model = _model()
    for alone in (True, False):
        with_cache, without = _runs(model, True), _runs(model, False)
        if alone:
            a = [run_together(model, [r])[0].tokens for r in with_cache]
            b = [run_together(model, [r])[0].tokens for r in without]
        else:
            a = [s.tokens for s in run_together(model, with_cache)]
            b = [s.tokens for s in run_together(model, without)]
        for x, y in zip(a, b):
            assert torch.equal(x, y) and not (x == V).any()


@torch.no_grad()
def test_runs_join_late_and_a_dropped_cache_is_rebuilt():
    model = _model()
    reference = [run_together(model, [r])[0].tokens for r in _runs(model, False, L)]
    runs = _runs(model, True, L)  # L steps: every run draws in each of the first three
    calls = []
    backbone = model.backbone
    forward, decode = backbone.forward, backbone.decode
    backbone.forward = lambda *a, **k: calls.append("prefill") or forward(*a, **k)
    backbone.decode = lambda *a, **k: calls.append("decode") or decode(*a, **k)
    try:
        batch_step(model, runs[:1])  # the first run alone, twice; then the others join
        batch_step(model, runs[:1])
        calls.clear()
        batch_step(model, runs)  # two calls for three runs: a prefill of the two new, a decode of the first
        assert sorted(calls) == ["decode", "prefill"]
        runs[1].kv = None  # as the service does for a run that sits out a step
        while live := [r for r in runs if not r.done]:
            calls.clear()
            batch_step(model, live)
            assert len(calls) <= 2
    finally:
        backbone.forward, backbone.decode = forward, decode
    for run, ref in zip(runs, reference):
        assert torch.equal(run.tokens, ref) and run.kv is None  # a finished run lets its cache go


@torch.no_grad()
def test_the_cost_model_counts_what_the_cache_holds():
    """``cost.kv_cache_row_bytes`` is a cache's bytes a sequence (float32), and admission's rows of a step that
    holds one (DCD's draw, ``Step.ar_cache``) count it."""
    from ttcore.sampling import cost
    from ttcore.sampling.steps.dcd import DCDStep

    model = tiny_ar(V, L)
    _, cache = prefill(model, torch.full((3, L), V))
    held = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in cache.layers) // 3
    assert cost.kv_cache_row_bytes(model.cfg, copies=1) == held
    diffusion = tiny_ar(V, L)  # its shape without causal: a masked diffusion model holds no cache
    diffusion.cfg.dit.causal = False
    assert cost.kv_cache_row_bytes(diffusion.cfg) == 0
    assert DCDStep.ar_cache and not GenerationRun(model, 1, L, LTR).sampler.ar_cache
    budget = 64 * cost.step_row_bytes(diffusion.cfg, False)
    assert cost.rows_per_pass(diffusion.cfg, False, budget) == 64
    assert cost.rows_per_pass(diffusion.cfg, False, budget, ar_cfg=model.cfg) < 64
    pair(diffusion, model)  # the run's own estimate (the service's and the recipes') finds the pair's cache
    assert cost.rows_for(diffusion, budget) == 64
    assert cost.rows_for(diffusion, budget, sampler="dcd") == cost.rows_per_pass(diffusion.cfg, False, budget,
                                                                                  ar_cfg=model.cfg)
