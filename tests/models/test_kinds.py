"""Model kinds (``ttcore.kinds``): each model is of the kind its config matches, a registered kind takes
precedence over the ones before it, a kind's rules decide what a generation or a score may do, and a pair of
models is held by the library, not written onto either."""

import gc

import pytest
import torch
from tiny import tiny_ar, tiny_model

from ttcore.errors import InvalidSampler
from ttcore.kinds import (
    AUTOREGRESSIVE,
    DIFFUSION,
    MODEL_KINDS,
    Diffusion,
    companion,
    get_kind,
    kind_of,
    pair,
    register_kind,
    unpair,
    unregister_kind,
)
from ttcore.sampling import GenerationRun, SamplerConfig
from ttcore.scoring import score

V, L = 3, 4


def test_each_model_is_of_the_kind_its_config_matches():
    assert kind_of(tiny_model("tt", V, L, 2, 0.5, 0.5).cfg) is DIFFUSION
    ar = tiny_ar(V, L)
    assert ar.cfg.kind is AUTOREGRESSIVE and ar.cfg.head_label == "ar"
    assert AUTOREGRESSIVE.model_id("qm9", ar.cfg) == "qm9-ar" and AUTOREGRESSIVE.default_steps(ar.cfg) == L
    with pytest.raises(ValueError, match="must be one of diffusion, autoregressive"):
        get_kind("block")


class OneStep(Diffusion):
    """A toy kind: diffusion models whose config's extra says ``one_step``, which generate in one step only."""
    name = "one-step"
    description = "a one-step model"

    def matches(self, cfg) -> bool:
        return bool(cfg.extra.get("one_step"))

    def check_run(self, config, steps, tokens, mask_id, constrained):
        super().check_run(config, steps, tokens, mask_id, constrained)
        if steps != 1:
            raise InvalidSampler("steps", f"a one-step model takes steps 1, got {steps}")


def test_a_registered_kind_claims_its_models_and_its_rules_refuse_a_run():
    model = tiny_model("tt", V, L, 2, 0.5, 0.5)
    register_kind(OneStep())
    try:
        assert model.cfg.kind is DIFFUSION  # its config does not say one_step
        model.cfg.extra["one_step"] = True
        assert model.cfg.kind.name == "one-step"
        GenerationRun(model, 2, 1, SamplerConfig(), seed=0)
        with pytest.raises(InvalidSampler, match="takes steps 1") as refused:
            GenerationRun(model, 2, 3, SamplerConfig(), seed=0)
        assert refused.value.field == "steps"
        with pytest.raises(ValueError, match="already registered"):
            register_kind(OneStep())
    finally:
        unregister_kind("one-step")
    assert model.cfg.kind is DIFFUSION and list(MODEL_KINDS) == ["diffusion", "autoregressive", "block_diffusion"]


def test_the_autoregressive_kind_refuses_what_it_cannot_generate_or_score_exactly():
    ar = tiny_ar(V, L)
    with pytest.raises(InvalidSampler) as refused:
        GenerationRun(ar, 1, L, SamplerConfig(ordering="random"), seed=0)
    assert refused.value.field == "ordering"
    with pytest.raises(InvalidSampler) as refused:
        GenerationRun(ar, 1, L - 1, SamplerConfig(ordering="left_to_right"), seed=0)
    assert refused.value.field == "steps"
    x = torch.zeros(1, L, dtype=torch.long)
    gap = torch.tensor([[False, True, False, True]])
    assert AUTOREGRESSIVE.score_refusal(ar.cfg, gap) is not None and DIFFUSION.score_refusal(ar.cfg, gap) is None
    suffix = torch.tensor([[False, False, True, True]])
    assert AUTOREGRESSIVE.score_refusal(ar.cfg, suffix) is None
    log_p, token = score(ar, x, suffix)  # the kind's exact score: the sum of the scored conditionals
    assert torch.allclose(log_p, token.nan_to_num(0.0).sum(1)) and token[0, :2].isnan().all()


def test_a_pair_is_held_by_the_library_not_written_onto_the_model():
    model, ar = tiny_model("tt", V, L, 2, 0.5, 0.5), tiny_ar(V, L)
    assert companion(model) is None
    pair(model, ar)
    assert companion(model) is ar and "ar_companion" not in vars(model) and companion(ar) is None
    with pytest.raises(ValueError, match="pair a masked diffusion model with an autoregressive one"):
        pair(ar, model)
    unpair(model)
    assert companion(model) is None
    pair(model, ar)
    other = tiny_model("tt", V, L, 2, 0.5, 0.5)
    assert companion(other) is None  # a pair is of one model, not of its config or its class
    from ttcore.kinds import pairing

    held = len(pairing._COMPANIONS)
    del model
    gc.collect()  # the pair ends with its diffusion model
    assert len(pairing._COMPANIONS) == held - 1
