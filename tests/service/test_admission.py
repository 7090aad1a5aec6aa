"""Admission's compute rule (``service.admission``): estimates that follow measured times, and hints
that are themselves settings the rule admits."""

import itertools
import math
import re
from pathlib import Path

import pytest
import torch

from service.admission import HINT_MARGIN, check_passes, plan
from service.refusals import TooLarge
from service.speed import CALIBRATION_ROWS, CALIBRATION_STEPS, WALL_HEADROOM, WINDOW, Speed, calibrate
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.sampling import SamplerConfig
from ttcore.sampling.cost import Work, work_of


def _model(decomposition="tt", vocab=8, rank=2, length=12):
    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig(vocab_size=vocab + 1, out_vocab=vocab, length=length, hidden_dim=16,
                                            cond_dim=8, n_blocks=1, n_heads=2)))
    return base if decomposition == "none" else JointModel.from_base(base, decomposition, rank, noise=0.1)


def test_the_estimate_is_the_timing_times_the_slowest_recent_ratio_and_never_falls_to_zero():
    """The review: each kind's per-sequence cost was ``max(seconds - overhead x steps, 0) / rows`` with an overhead
    timed once on a busy machine, so after ordinary traffic ``GET /models`` showed 0.0 and a 256 x 1024 request
    with ``timeout_s: 1`` was admitted and timed out. Now a request adds the ratio of what it took to what the
    model said (two positive times: never 0), and the estimate is the model times the largest of the last
    WINDOW ratios: an upper bound of recent requests, which a busy stretch raises at once. A request faster than
    the model lowers the estimate only of requests no larger than itself."""
    busy = Speed({"predetermined_step": (0.1, 0.001)})  # an overhead timed while the machine was busy
    for _ in range(WINDOW):  # ordinary requests: 64 rows x 8 steps at 0.05 s a step
        busy.observe("predetermined_step", rows=64, steps=8, seconds=8 * 0.05)
    old_rule = max(8 * 0.05 - 0.1 * 8, 0.0) / 64  # what the review saw
    assert old_rule == 0.0 and busy.estimate("predetermined_step") > 0
    assert busy.step_seconds("predetermined_step", 64) == pytest.approx(0.05)  # what the requests took
    assert busy.step_seconds("predetermined_step", 16) == pytest.approx(0.05 / 0.164 * 0.116)
    # faster than the model at 64 rows says nothing of 256: the timing's figure stands there
    assert busy.step_seconds("predetermined_step", 256) == pytest.approx(0.1 + 0.256)
    with pytest.raises(TooLarge) as e:  # the review's probe on a 12-position model: refused up front
        plan(_model("none"), busy, num_samples=256, steps=1024, config=SamplerConfig(), timeout_s=1.0,
             memory_budget=1 << 30, step_limit_s=60.0)
    assert e.value.field == "num_samples"

    speed = Speed({"predetermined_step": (0.005, 0.001), "exact_step": (0.0, 2.0), "chain_rule": (0.0, 10.0)})
    assert speed.step_seconds("predetermined_step", 10) == pytest.approx(0.015)  # the timing alone: ratio 1
    speed.observe("predetermined_step", rows=10, steps=4, seconds=4 * 0.015 * 2)  # twice as slow
    assert speed.step_seconds("predetermined_step", 10) == pytest.approx(0.030)
    assert speed.step_seconds("predetermined_step", 1000) == pytest.approx(2 * (0.005 + 1000 * 0.001))  # slower: all
    for _ in range(WINDOW - 1):  # faster requests do not lower it while the slow one is among the last WINDOW
        speed.observe("predetermined_step", rows=10, steps=4, seconds=4 * 0.015 / 2)
    assert speed.step_seconds("predetermined_step", 10) == pytest.approx(0.030)
    speed.observe("predetermined_step", rows=10, steps=4, seconds=4 * 0.015 / 2)  # the slow one leaves the window
    assert speed.step_seconds("predetermined_step", 10) == pytest.approx(0.0075)
    assert speed.step_seconds("predetermined_step", 11) == pytest.approx(0.016)  # larger than any measured
    assert speed.estimate("exact_step") == 2.0 and speed.chain_seconds(3) == 30.0  # other kinds untouched
    speed.observe("chain_rule", rows=2, steps=4, seconds=3 * (4 * 0.007 + 2 * 10.0))  # the whole run's model x 3
    assert speed.chain_seconds(1) == pytest.approx(30.0) and speed.margin("predetermined_step") == 0.5
    for bad in (0.0, -1.0, float("nan"), float("inf")):  # nothing that is not a positive time counts
        speed.observe("exact_step", rows=1, steps=1, seconds=bad)
    assert speed.unmeasured("exact_step")
    with pytest.raises(ValueError, match="kind"):
        speed.observe("approximate", rows=1, steps=1, seconds=1.0)


def test_calibration_is_a_few_short_timings():
    speed = calibrate(_model())
    assert all(speed.timed(k) for k in Speed.KINDS)
    assert 0 < speed.estimate("predetermined_step") < 1 and 0 < speed.estimate("exact_step") < 1
    assert 0 < speed.estimate("chooser_step") < 1 and 0 < speed.estimate("tempered_step") < 1
    assert 0 <= speed.estimate("chain_rule") < 5
    assert all(speed.unmeasured(k) for k in Speed.KINDS)  # only the timings speak yet


def test_a_step_of_many_rows_is_estimated_as_overhead_plus_rows_not_rows_one_row_steps():
    """The review: a 256-row step was estimated as 256 one-row steps (QM9 CP r=64: 274 s estimated on a busy
    start for a request served in seconds). The calibration times one row and a few rows and keeps the
    per-step overhead apart, so many rows cost less than as many one-row steps; a request batched with others
    is modelled with its share of each step's overhead."""
    speed = calibrate(_model("cp"))
    one, many = speed.step_seconds("predetermined_step", 1), speed.step_seconds("predetermined_step", 256)
    assert speed.overhead_seconds("predetermined_step") > 0 and many < 256 * one
    speed = Speed({"predetermined_step": (0.005, 0.001)})
    assert speed.step_seconds("predetermined_step", 256) == pytest.approx(0.005 + 0.256)
    assert speed.step_seconds("chain_rule", 4) == pytest.approx(0.005 + 0.004)  # its steps are predetermined
    speed.observe("predetermined_step", rows=64, steps=4, seconds=4 * (0.005 + 64 * 0.003))
    assert speed.step_seconds("predetermined_step", 64) == pytest.approx(0.005 + 64 * 0.003)  # what it took
    batched = Speed({"predetermined_step": (0.005, 0.001)})  # charged a quarter of each step's overhead
    batched.observe("predetermined_step", rows=8, steps=2, seconds=2 * (0.005 / 4 + 8 * 0.001), overhead_steps=0.5)
    assert batched.margin("predetermined_step") == pytest.approx(1.0)


def test_the_settings_that_change_a_steps_work_scale_its_estimate():
    """The review: ``chooser_outputs: 4096`` on text ran one 11.7 s step past a 5 s step limit (the setting was
    not in the estimate), and a temperature other than 1 sums every masked position of a joint head (the
    bundled text TT: 0.31 s a sequence per step against 0.0067 at temperature 1). More chooser outputs than
    the default and a temperature each change the estimate."""
    model = _model()
    cfg = model.cfg
    fast = dict(ordering="top_prob", adaptive_path="fast")
    assert work_of(cfg, SamplerConfig(), 8) == Work("predetermined_step", 1.0)
    assert work_of(cfg, SamplerConfig(), 1) == Work("predetermined_step", 1.0)  # timed at one step: the dearest
    assert CALIBRATION_STEPS == 1
    assert work_of(cfg, SamplerConfig(temperature=0.5), 8).kind == "tempered_step"
    assert work_of(_model("none").cfg, SamplerConfig(temperature=0.5), 8).kind == "predetermined_step"  # logits / T
    e = cfg.format.outputs_per_position(cfg.rank)  # 4 outputs per position; the default c is all of them here
    assert work_of(cfg, SamplerConfig(chooser_outputs=1, **fast), 8).scale == 1.0  # fewer: no discount
    wide = _model("tt", vocab=64, rank=8)  # the default c is 2048 // 64 = 32 of 64 outputs: all of them doubles it
    wcfg = wide.cfg
    assert work_of(wcfg, SamplerConfig(chooser_outputs=64, **fast), 8) == Work("chooser_step", 2.0)
    speed = Speed({"chooser_step": (0.0, 0.01)})
    kw = dict(num_samples=64, steps=8, timeout_s=600.0, memory_budget=1 << 30, step_limit_s=1.0)
    plan(wide, speed, config=SamplerConfig(**fast), **kw)  # 0.64 s a step: within the limit
    with pytest.raises(TooLarge) as err:
        plan(wide, speed, config=SamplerConfig(chooser_outputs=64, **fast), **kw)  # 1.28 s
    assert err.value.field == "num_samples" and "at most 50" in str(err.value)
    assert e == 4
    from ttcore.models.checkpoint import read_config  # the bundled text TT: E = 16 outputs, V = 8192, c = 1
    text = ModelConfig(**read_config(Path(__file__).resolve().parents[2] / "checkpoints" / "text-tt-r4")["model"])
    assert work_of(text, SamplerConfig(chooser_outputs=4096, **fast), 8) == Work("chooser_step", 16.0)


def test_an_inflated_timing_of_an_unmeasured_kind_can_be_re_timed():
    """The review: a server calibrated on a busy machine refused QM9 CP r=64 256 x 4 as "about 274 s", and a
    kind whose requests are all refused never finishes one, so nothing corrected it. After such a refusal
    the service re-times the kind in the background (``Speed.recalibrate``, here on a real model); only
    unmeasured kinds, and at most once a minute each, so refusals cannot buy timings."""
    model = _model("cp")
    busy = Speed({"predetermined_step": (0.1, 0.5), "exact_step": (0.0, 0.5)})
    kw = dict(num_samples=256, steps=4, config=SamplerConfig(), timeout_s=60.0, memory_budget=1 << 30,
              step_limit_s=60.0)
    with pytest.raises(TooLarge):
        plan(model, busy, **kw)
    assert busy.may_recalibrate("predetermined_step")
    busy.mark_recalibrating("predetermined_step")
    assert not busy.may_recalibrate("predetermined_step")  # one re-timing at a time, then one a minute
    busy.recalibrate(model, "predetermined_step")
    assert busy.estimate("predetermined_step") < 0.05 and plan(model, busy, **kw).seconds < 60
    assert busy.estimate("exact_step") == 0.5  # only the kind asked for
    measured = Speed({"predetermined_step": (0.0, 0.5), "exact_step": (0.0, 0.5)})
    measured.observe("exact_step", rows=4, steps=2, seconds=4.0)
    assert not measured.may_recalibrate("exact_step")  # a measured kind: requests speak for it
    chain = Speed({"predetermined_step": (0.0, 0.5), "chain_rule": (0.0, 100.0)})
    chain.recalibrate(model, "chain_rule")
    assert chain.chain_seconds(1) < 100.0 and chain.estimate("predetermined_step") < 0.5  # steps re-timed too


def test_a_hint_does_not_drift_with_the_estimate():
    """The review: identical requests were told "at most 152", then "at most 151", and "use at most 22 steps"
    then 20 (the estimate moves with every measured request). Hints keep two significant digits from 100 up
    and are multiples of 5 from 10 to 99, rounded down."""
    model = _model("none")
    hints = set()
    for per_row in (0.0100, 0.01003, 0.01006):  # at most 152, 152 and 151 before
        speed = Speed({"predetermined_step": (0.0, per_row)})
        with pytest.raises(TooLarge) as e:
            plan(model, speed, num_samples=1000, steps=4, config=SamplerConfig(),
                 timeout_s=6.1 * WALL_HEADROOM * HINT_MARGIN, memory_budget=1 << 30, step_limit_s=60.0)
        hints.add(int(re.search(r"at most (\d+)", str(e.value)).group(1)))
    assert hints == {150}, hints
    hints, model = set(), _model("none", length=24)
    for timeout in (0.0115 * HINT_MARGIN, 0.0108 * HINT_MARGIN, 0.0101 * HINT_MARGIN):  # 11, 10 and 10 steps
        # fit a one-row request with the hint's margin (headroom aside)
        speed = Speed({"predetermined_step": (0.0, 0.001)})
        with pytest.raises(TooLarge) as e:
            plan(model, speed, num_samples=1, steps=24, config=SamplerConfig(), timeout_s=timeout * WALL_HEADROOM,
                 memory_budget=1 << 30, step_limit_s=60.0)
        hints.add(int(re.search(r"use at most (\d+) steps", str(e.value)).group(1)))
    assert hints == {10}, hints


def test_generation_names_the_step_limit_when_the_step_limit_refused():
    """The review: /generate's 422 blamed ``timeout_s`` when the step limit refused (a longer deadline would not
    have helped). One sequence's step above ``--max-step-s`` names the rule and what changes a step's work."""
    model = _model("none")
    slow = Speed({"predetermined_step": (0.0, 5.0)})
    with pytest.raises(TooLarge) as e:
        plan(model, slow, num_samples=4, steps=4, config=SamplerConfig(), timeout_s=600.0, memory_budget=1 << 30,
             step_limit_s=2.0)
    assert e.value.field == "model" and "step limit of 2 s (--max-step-s)" in str(e.value)
    with pytest.raises(TooLarge) as e:  # a deadline too short is still the deadline's refusal
        plan(model, slow, num_samples=4, steps=4, config=SamplerConfig(), timeout_s=1.0, memory_budget=1 << 30,
             step_limit_s=60.0)
    assert e.value.field == "timeout_s"


def test_scoring_names_the_step_limit_when_the_step_limit_refused():
    """The review: /score's 422 said ``timeout_s`` when the per-step limit (``--max-step-s``) refused it. Each
    refusal now names the rule that refused, and its hint is admitted."""
    def pass_seconds(n):
        return 0.01 + 0.1 * n

    with pytest.raises(TooLarge) as e:  # a deadline of an hour: only the step limit can refuse
        check_passes(50, 1, 64, pass_seconds, 3600.0, 2.0, "joint")
    assert e.value.field == "sequences" and "step limit of 2 s (--max-step-s" in str(e.value)
    assert "timeout_s" not in str(e.value)
    fit = int(re.search(r"at most (\d+) sequences", str(e.value)).group(1))
    assert check_passes(fit, 1, 64, pass_seconds, 3600.0, 2.0, "joint") > 0
    with pytest.raises(TooLarge) as e:  # the deadline refuses: it says timeout_s
        check_passes(50, 4, 8, pass_seconds, 3.0, 2.0, "joint")
    assert "timeout_s 3" in str(e.value) and "step limit" not in str(e.value)
    fit = int(re.search(r"at most (\d+) sequences", str(e.value)).group(1))
    assert check_passes(fit, 4, 8, pass_seconds, 3.0, 2.0, "joint") <= 3.0
    assert CALIBRATION_ROWS > 1


def _admitted(model, speed, **kw):
    try:
        plan(model, speed, memory_budget=1 << 30, **kw)
        return True
    except TooLarge:
        return False


@pytest.mark.parametrize("adaptive", [False, True])
def test_every_hint_is_a_setting_that_is_admitted(adaptive):
    """The review: ``timeout_s: 1.5`` with top_prob said "at most about 35 steps" for 35, 12, 8, 4, 2 and 1
    steps (the chain rule's cost was left out), and ``timeout_s: 0.001`` said "at most about 0"."""
    model = _model()
    speed = Speed({"predetermined_step": (0.0, 0.01), "exact_step": (0.0, 0.02),
                   "chain_rule": (0.0, 0.5 if adaptive else 0.0)})
    checked = 0
    for n, k, timeout, limit in itertools.product((1, 8, 64), (1, 2, 8, 35, 1000), (0.001, 0.05, 1.5, 30.0),
                                                  (0.05, 60.0)):
        config = SamplerConfig(ordering="top_prob", adaptive_path="exact") if adaptive else SamplerConfig()
        kw = dict(num_samples=n, steps=k, config=config, timeout_s=timeout, step_limit_s=limit)
        try:
            plan(model, speed, memory_budget=1 << 30, **kw)
            continue
        except TooLarge as e:
            field, message = e.field, str(e)
        checked += 1
        if field == "num_samples":
            fit = int(re.search(r"num_samples can be at most (\d+)", message).group(1))
            assert 1 <= fit < n and _admitted(model, speed, **dict(kw, num_samples=fit)), message
            grid = 1 if fit < 10 else 5 if fit < 100 else 10 ** (len(str(fit)) - 2)  # the hint's rounding
            spare = dict(kw, timeout_s=timeout / HINT_MARGIN)  # the hint fits with the margin to spare, where any does
            if _admitted(model, speed, **dict(spare, num_samples=1)):
                assert _admitted(model, speed, **dict(spare, num_samples=fit)), message
                assert not _admitted(model, speed, **dict(spare, num_samples=fit + grid)), message  # the largest
            else:
                assert not _admitted(model, speed, **dict(kw, num_samples=fit + grid)), message
        elif field == "steps":
            k_fit = int(re.search(r"use at most (\d+) steps", message).group(1))
            n_fit = 1 if "with num_samples 1" in message else n
            assert 1 <= k_fit and _admitted(model, speed, **dict(kw, steps=k_fit, num_samples=n_fit)), message
        else:  # nothing fits: say so, and it is true
            assert (field == "timeout_s" and "no num_samples or steps fits" in message) or (
                field in ("ordering", "model") and "step limit" in message), message
            assert not any(_admitted(model, speed, **dict(kw, num_samples=1, steps=s)) for s in range(1, 13))
    assert checked > 20


def test_a_text_eb_request_of_64_samples_and_16_steps_is_admitted_on_the_default_memory_budget():
    """The bundled text TT: EB-Sampler with the default fast adaptive path runs 64 rows in one pass within the
    server's default memory budget; by the exact chain rule the same request needs micro-batches and more time
    (its estimate is the chain rule's). Memory and work, not this machine's speed: the deadline and the step
    limit are left open here (the deadline rule has its own tests above, on timings given to it)."""
    from pathlib import Path

    from service.config import ServiceArgs
    from service.schema import GenerateRequest
    from ttcore.models import load_for_inference

    model, _, _ = load_for_inference(Path(__file__).resolve().parents[2] / "checkpoints" / "text-tt-r4", "cpu", "auto")
    speed, args = calibrate(model), ServiceArgs()
    limits = dict(num_samples=64, steps=16, timeout_s=math.inf, memory_budget=args.memory_budget_mb << 20,
                  step_limit_s=math.inf)
    fast = GenerateRequest(model="text", sampler="eb", num_samples=64, steps=16).to_sampler_config()
    assert fast.adaptive_path == "fast" and fast.work_kind(model.cfg) == "chooser_step"
    admitted = plan(model, speed, config=fast, **limits)
    assert admitted.max_rows_per_pass is None and 0 < admitted.seconds < math.inf
    exact = GenerateRequest(model="text", sampler="eb", num_samples=64, steps=16, adaptive_path="exact")
    slow = plan(model, speed, config=exact.to_sampler_config(), **limits)
    assert slow.max_rows_per_pass is not None and slow.seconds > admitted.seconds


def test_a_stream_is_refused_above_the_stream_limit_naming_what_to_lower():
    """The review: a 100-byte request streamed 57-66 MB (text, 256 samples x 1024 positions with step tokens).
    Streams are estimated before admission and held under ``--max-stream-mb``; each hint fits."""
    from service.admission import check_stream, stream_bytes

    limit = 16 << 20
    assert 66e6 <= stream_bytes(256, 16, 1024, True) <= 1.1 * 66e6  # the review's request measured 57-66 MB
    with pytest.raises(TooLarge) as e:
        check_stream(256, 16, 1024, True, 1, limit)
    assert e.value.field == "num_samples" and "--max-stream-mb" in str(e.value) and not e.value.compute
    fit = int(re.search(r"at most (\d+)", str(e.value)).group(1))
    assert check_stream(fit, 16, 1024, True, 1, limit) <= limit
    with pytest.raises(TooLarge) as e:  # fits without the step tokens: says so
        check_stream(100, 16, 1024, True, 1, limit)
    assert e.value.field == "step_tokens" and check_stream(100, 16, 1024, False, 1, limit) <= limit
    with pytest.raises(TooLarge) as e:  # valid_only streams up to MAX_VALID_ROUNDS rounds
        check_stream(100, 16, 1024, False, 4, limit)
    assert e.value.field == "num_samples"


def test_a_stream_budget_counts_what_is_sent_and_refuses_what_would_pass_the_limit():
    from service.admission import StreamBudget

    budget = StreamBudget(100)
    assert budget.allows(b"x" * 60) and budget.sent == 60
    assert not budget.allows(b"x" * 30, reserve=20) and budget.sent == 60  # 60 + 30 + 20 > 100: not counted
    assert budget.allows(b"x" * 30) and budget.sent == 90 and "--max-stream-mb" in budget.message()
