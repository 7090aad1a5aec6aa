"""The HTTP API against a real uvicorn server (subprocess) on tiny trained checkpoints."""

import asyncio
import os
import re
import time

import httpx
import pytest
from common import lone_run_texts, metric, stream_events
from servers import start_uvicorn, stderr_tail

pytestmark = pytest.mark.slow  # servers, Ray, training or end-to-end commands


def test_health_ready_models(server):
    assert httpx.get(server + "/health").json()["status"] == "ok"
    ready = httpx.get(server + "/ready").json()
    assert ready["models"] == 4 and "broken" in ready["refused"]  # the broken checkpoint is refused, the rest served
    models = httpx.get(server + "/models").json()["models"]
    assert {(m["model"], m["decomposition"], m["rank"]) for m in models} == {
        ("qm9", "none", 1), ("qm9", "tt", 2), ("qm9", "cp", 3), ("text", "none", 1)}
    assert all(m["length"] > 0 and m["vocab_size"] > 0 and m["card_url"] for m in models)
    assert all(any(line.startswith("steps:") for line in m["summary"]) for m in models)
    assert all(m["adaptive_paths"] == ["fast", "exact"] for m in models)  # what each checkpoint serves
    # each kind of work is timed when a request first needs it (not at start-up), then shown with its estimate
    r = httpx.post(server + "/generate", json=dict(model="qm9", decomposition="cp", ordering="top_prob",
                                                     adaptive_path="fast", num_samples=2, steps=4), timeout=60)
    assert r.status_code == 200, r.text
    cp = next(m for m in httpx.get(server + "/models").json()["models"] if m["checkpoint"] == "qm9-cp-r3")
    assert cp["estimated_seconds"]["chooser_step"] > 0 and "chooser_step" in cp["estimated_step_overhead_seconds"]
    assert 2 <= cp["estimated_timed_rows"]["chooser_step"] <= 64  # what its timing ran (at least 2, at most 64)
    card = httpx.get(server + models[0]["card_url"])  # the card itself, served apart (was inlined: 13 KB each)
    assert card.status_code == 200 and card.text.startswith("# ") and card.headers["content-type"].startswith(
        "text/markdown")
    assert httpx.get(server + "/models/nonexistent/card").status_code == 404
    spec = httpx.get(server + "/openapi.json").json()
    fields = spec["components"]["schemas"]["GenerateRequest"]["properties"]
    assert all(f.get("description") for f in fields.values())


@pytest.mark.parametrize("body", [
    dict(num_samples=3, steps=5, seed=1),
    dict(decomposition="cp", num_samples=2, steps=4, seed=2, ordering="top_prob"),
    dict(decomposition="none", num_samples=2, steps=6, seed=3, sampler="eb", eb_gamma=0.3),
    dict(num_samples=2, steps=4, seed=4, prompt="C[MASK]O", ordering="left_to_right"),
    dict(num_samples=3, steps=4, seed=5, contraction="exact"),
    dict(num_samples=3, steps=4, seed=6, temperature=0.7),
])
def test_seeded_answer_equals_a_lone_generate_run(server, checkpoints, body):
    r = httpx.post(server + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    want_dir = {"tt": "qm9-tt-r2", "cp": "qm9-cp-r3", "none": "qm9-base"}[body.get("decomposition", "tt")]
    assert out["checkpoint"] == want_dir and out["steps"] <= body["steps"]
    assert [s["text"] for s in out["samples"]] == lone_run_texts(checkpoints / want_dir, body)
    assert all(isinstance(s["valid"], bool) for s in out["samples"])
    if body.get("prompt"):
        assert all(s["text"].startswith("C") for s in out["samples"])


def test_text_family_streams_with_a_prefix_prompt(server):
    events = stream_events(server, dict(model="text", num_samples=2, steps=6, seed=0, prompt="The Congress shall"))
    assert [e[1] for e in events] == ["step"] * 6 + ["done"]
    answer = events[-1][2]
    assert answer["model"] == "text" and answer["checkpoint"] == "text-base"
    assert all(s["text"].startswith("The Congress shall") and s["valid"] is None for s in answer["samples"])


def test_stream_events_arrive_as_they_happen(server):
    length = next(m for m in httpx.get(server + "/models").json()["models"] if m["model"] == "qm9")["length"]
    events = stream_events(server, dict(num_samples=64, steps=30, seed=0, ordering="top_prob"))
    steps = [e for e in events if e[1] == "step"]
    # 30 steps over fewer positions: only the steps that commit send an event (one position each here)
    assert length < 30 and len(steps) == length and events[-1][1] == "done"
    numbers = [p["step"] for _, _, p in steps]
    assert numbers == sorted(set(numbers)) and numbers[-1] <= 30
    assert all(sum(map(len, p["committed"])) > 0 for _, _, p in steps)
    assert steps[0][0] >= 1  # the first step's event arrived while its request still ran: not buffered to the end
    assert "[MASK]" in steps[0][2]["sequences"][0] and "[MASK]" not in steps[-1][2]["sequences"][0]
    assert sum(len(c) for c in steps[0][2]["committed"]) > 0


def test_concurrent_requests_share_forward_passes(server, checkpoints):
    before = httpx.get(server + "/metrics").text
    bodies = [dict(num_samples=2, steps=20 + 3 * k, seed=10 + k, ordering=o)
              for k, o in enumerate(["random", "top_prob", "entropy", "left_to_right", "halton", "margin"])]

    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*[client.post(server + "/generate", json=b) for b in bodies])

    answers = asyncio.run(go())
    after = httpx.get(server + "/metrics").text
    for body, r in zip(bodies, answers):
        assert r.status_code == 200
        assert [s["text"] for s in r.json()["samples"]] == lone_run_texts(checkpoints / "qm9-tt-r2", body)
    name = "ttcore_forward_batch_requests"
    shared = (metric(after, name + "_count") - metric(after, name + "_bucket", 'le="1.0"')) - \
             (metric(before, name + "_count") - metric(before, name + "_bucket", 'le="1.0"'))
    assert shared > 0  # some forward passes served several requests at once
    calls = sum(r.json()["model_calls"] for r in answers)
    passes = metric(after, name + "_count") - metric(before, name + "_count")
    assert passes < calls


def test_disconnect_cancels(server):
    before = httpx.get(server + "/metrics").text
    with httpx.stream("POST", server + "/generate", json=dict(num_samples=128, steps=1000, stream=True, seed=0,
                                                             ordering="entropy"), timeout=60) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        r.close()  # one event, then hang up
    deadline = time.time() + 120  # a hang guard
    while time.time() < deadline:
        text = httpx.get(server + "/metrics").text
        if metric(text, "ttcore_cancelled_total") > metric(before, "ttcore_cancelled_total"):
            break
        time.sleep(0.1)
    assert metric(text, "ttcore_cancelled_total") == metric(before, "ttcore_cancelled_total") + 1
    assert metric(text, "ttcore_queue_depth") == 0
    # K = 1000 > l: a token every ~50 steps; stopped after a few steps, it unmasked few of its 128 x l
    tokens = metric(text, "ttcore_tokens_generated_total") - metric(before, "ttcore_tokens_generated_total")
    assert tokens < 128 * 5


@pytest.mark.parametrize("body,field", [
    (dict(steps=0), "steps"), (dict(steps=5000), "steps"), (dict(num_samples=0), "num_samples"),
    (dict(num_samples=1000), "num_samples"), (dict(ordering="sideways"), "ordering"),
    (dict(temperature=0), "temperature"), (dict(eb_gamma=-1), "eb_gamma"), (dict(sampler="greedy"), "sampler"),
    (dict(eb_proxy="vibes"), "eb_proxy"), (dict(seed=-3), "seed"), (dict(prompt="CXC"), "prompt"),
    (dict(prompt="C" * 200), "prompt"), (dict(prompt="CBr"), "prompt"), (dict(stream="maybe"), "stream"),
    (dict(steps="many"), "steps"), (dict(unknown_field=1), "unknown_field"), (dict(rank=0), "rank"),
    (dict(contraction="approximate"), "contraction"), (dict(temperature=1e-38), "temperature"),
    (dict(stream=0), "stream"), (dict(stream="true"), "stream"),
])
def test_bad_input_is_422_naming_the_field(server, body, field):
    r = httpx.post(server + "/generate", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][-1] == field and d["msg"] for d in detail), detail


@pytest.mark.parametrize("raw,field", [
    ('{"temperature": 1e999}', "temperature"), ('{"temperature": NaN}', "temperature"),
    ('{"temperature": Infinity}', "temperature"), ('{"num_samples": 1e400}', "num_samples"),
    ('{"sampler": "eb", "eb_gamma": NaN}', "eb_gamma"), ('{"sampler": "eb", "eb_gamma": -Infinity}', "eb_gamma"),
    ('{"prompt": "C\\ud800"}', "prompt"),
])
def test_non_finite_numbers_and_lone_surrogates_are_422_not_500(server, raw, field):
    """Reproductions from review: each was a 500 (the 422 echoed an input JSON cannot encode)."""
    r = httpx.post(server + "/generate", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][-1] == field and d["msg"] for d in detail), detail
    assert all("input" not in d for d in detail)


def test_a_huge_invalid_field_is_not_echoed(server):
    r = httpx.post(server + "/generate", json={"model": "q" * 100_000})
    assert r.status_code == 422 and len(r.content) < 1000, len(r.content)


def test_malformed_json_and_unknown_model(server):
    r = httpx.post(server + "/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400  # as the OpenAPI document says
    r = httpx.post(server + "/generate", json=dict(model="proteins"))
    assert r.status_code == 404 and "qm9/tt/r2" in r.json()["detail"]
    # curl -d without a content type sends a form: the answer says the body must be JSON, and how
    r = httpx.post(server + "/generate", content=b'{"num_samples": 2}',
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "content-type: application/json" in r.json()["detail"], r.text
    assert "application/x-www-form-urlencoded" in r.json()["detail"]
    r = httpx.post(server + "/v1/completions", content=b'{"prompt": "C"}', headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "content-type: application/json" in r.json()["error"]["message"], r.text
    r = httpx.post(server + "/generate", json=dict(decomposition="tt", rank=8))
    assert r.status_code == 404 and {"model": "qm9", "decomposition": "tt", "rank": 2, "checkpoint": "qm9-tt-r2"} \
        in r.json()["available"]


def test_metrics_expose_the_series(server):
    httpx.post(server + "/generate", json=dict(num_samples=1, steps=2, seed=0))
    text = httpx.get(server + "/metrics").text
    for name in ["ttcore_requests_total", "ttcore_request_latency_seconds_bucket",
                 "ttcore_time_to_first_event_seconds_bucket", "ttcore_samples_generated_total",
                 "ttcore_tokens_generated_total", "ttcore_denoising_steps_total", "ttcore_forward_batch_samples_bucket",
                 "ttcore_queue_depth", "ttcore_model_calls_per_request_bucket"]:
        assert name in text, name
    assert metric(text, "ttcore_requests_total", 'route="/generate",status="200"') >= 1


def test_backpressure_503_with_retry_after(checkpoints):
    proc, url = start_uvicorn(checkpoints, "--max-requests", "1")
    try:
        with httpx.stream("POST", url + "/generate", json=dict(num_samples=256, steps=1000, stream=True),
                          timeout=60) as r:
            lines = r.iter_lines()  # kept referenced: the connection stays open while we wait
            while not next(lines).startswith("data: "):
                pass
            busy = httpx.post(url + "/generate", json=dict(num_samples=1, steps=2))
            assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1  # seconds until a slot frees
        deadline = time.time() + 120  # a hang guard: the hung-up stream is cancelled, and the slot comes back
        while httpx.post(url + "/generate", json=dict(num_samples=1, steps=2)).status_code != 200:
            assert time.time() < deadline
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_smiles_served_without_rdkit(checkpoints, tmp_path):
    """A server installed without the chem extra still serves SMILES, with valid/canonical null."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['rdkit'] = None  # import rdkit fails\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    proc, url = start_uvicorn(checkpoints, env={"PYTHONPATH": path})
    try:
        r = httpx.post(url + "/generate", json=dict(model="qm9", num_samples=3, steps=4, seed=0), timeout=60)
        assert r.status_code == 200, r.text
        samples = r.json()["samples"]
        assert len(samples) == 3 and all(s["valid"] is None and s["canonical"] is None for s in samples)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "RDKit is not importable" in stderr_tail(proc, 100_000)


def test_answers_carry_telemetry_and_the_metrics_count_it(server):
    r = httpx.post(server + "/generate", json=dict(model="qm9", num_samples=4, steps=8, seed=0), timeout=60).json()
    t = r["timings"]
    assert t["forward_ms"] > 0 and t["sampling_ms"] > 0 and t["decode_ms"] > 0
    assert t["queue_ms"] + t["forward_ms"] + t["sampling_ms"] + t["decode_ms"] <= t["total_ms"] + 1
    length = httpx.get(server + "/models").json()["models"][0]["length"]
    assert len(r["tokens_per_step"]) == r["steps"] and sum(r["tokens_per_step"]) == 4 * length
    text = httpx.get(server + "/metrics").text
    assert metric(text, "ttcore_request_phase_seconds_count", 'phase="forward"') >= 1
    assert metric(text, "ttcore_tokens_per_step_count") >= r["steps"]


def test_joint_false_serves_the_rank_one_view(server):
    body = dict(model="qm9", decomposition="tt", num_samples=8, steps=4, seed=0)
    joint = httpx.post(server + "/generate", json=body, timeout=60).json()
    view = httpx.post(server + "/generate", json=dict(body, joint=False), timeout=60).json()
    assert view["checkpoint"] == joint["checkpoint"] and len(view["samples"]) == 8
    assert [s["text"] for s in view["samples"]] != [s["text"] for s in joint["samples"]]
    bad = httpx.post(server + "/generate", json=dict(body, joint=False, sampler="eb"))
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "joint"]


def test_chemists_options_unique_valid_only_and_descriptors(server):
    body = dict(model="qm9", decomposition="tt", num_samples=8, steps=6, seed=4)
    plain = httpx.post(server + "/generate", json=body, timeout=60).json()
    assert plain["drawn"] == 8 and plain["rounds"] == 1 and len(plain["samples"]) == 8
    for s in plain["samples"]:  # descriptors exactly for the valid molecules, in their ranges
        assert (s["qed"] is not None) == s["valid"] == (s["mol_weight"] is not None) == (s["logp"] is not None)
        assert s["qed"] is None or (0 < s["qed"] < 1 and s["mol_weight"] > 0)
    unique = httpx.post(server + "/generate", json=dict(body, unique=True), timeout=60).json()
    keys = [s["canonical"] or s["text"] for s in unique["samples"]]
    assert len(keys) == len(set(keys)) == len({s["canonical"] or s["text"] for s in plain["samples"]})
    valid = httpx.post(server + "/generate", json=dict(body, valid_only=True, unique=True), timeout=120).json()
    assert all(s["valid"] for s in valid["samples"]) and 1 <= valid["rounds"] <= 4
    assert valid["drawn"] == 8 * valid["rounds"] and valid["steps"] == 6 * valid["rounds"]
    assert len(valid["samples"]) == 8 or valid["rounds"] == 4
    assert len({s["canonical"] for s in valid["samples"]}) == len(valid["samples"])
    # round 0 is the plain request's draw (same seed): its valid molecules, duplicates dropped, come first
    expected = list(dict.fromkeys(s["canonical"] for s in plain["samples"] if s["valid"]))
    assert [s["canonical"] for s in valid["samples"][:len(expected)]] == expected
    r = httpx.post(server + "/generate", json=dict(model="text", valid_only=True))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "valid_only"]


def test_valid_only_streams_every_round_under_one_id(server):
    events = stream_events(server, dict(model="qm9", decomposition="tt", num_samples=8, steps=3, seed=4,
                                        valid_only=True, step_tokens=True))
    steps = [e[2] for e in events if e[1] == "step"]
    done = events[-1][2]
    assert events[-1][1] == "done" and len(steps) == 3 * done["rounds"]
    assert {s["id"] for s in steps} == {done["id"]} and [s["round"] for s in steps] == sorted(s["round"] for s in steps)
    for s in steps:  # each position's token; a committed position is no longer a mask
        assert all(tok != "[MASK]" for row, pos in zip(s["tokens"], s["committed"]) for tok in (row[p] for p in pos))


def test_depict_draws_valid_smiles_and_refuses_the_rest(server):
    r = httpx.get(server + "/depict", params={"smiles": "c1ccccc1O", "width": 120, "height": 100})
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
    assert r.text.lstrip().startswith("<?xml") and "<svg" in r.text and "width='120px'" in r.text
    # "C junk" and "CCO\nx" RDKit reads as a molecule and its name: not one SMILES, so not drawn
    for params, field in (({"smiles": "C1CC"}, "smiles"), ({"smiles": "C" * 300}, "smiles"),
                          ({"smiles": "CCO", "width": 10}, "width"), ({}, "smiles"), ({"smiles": "C junk"}, "smiles"),
                          ({"smiles": "CCO\nx"}, "smiles"), ({"smiles": "CCÖ"}, "smiles")):
        r = httpx.get(server + "/depict", params=params)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", field], (params, r.text)
    # the document says so: the pattern the server enforces, and the 422's body
    depict = httpx.get(server + "/openapi.json").json()["paths"]["/depict"]["get"]
    smiles = next(p for p in depict["parameters"] if p["name"] == "smiles")["schema"]
    assert re.fullmatch(smiles["pattern"], "c1ccccc1O") and not re.search(smiles["pattern"], "C junk")
    assert depict["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/InvalidAnswer")


def test_a_molecule_rdkit_cannot_read_back_is_answered_invalid_not_a_500(server):
    """The review's 500: a generated molecule that RDKit parses but cannot read back from its canonical SMILES
    (``C=1CC=2ccnnc21``) made the answer's QED raise. A stranger can ask for it outright, with a template that fixes
    every position: the answer says it is not valid, with no descriptors, and /depict refuses it."""
    length = next(m for m in httpx.get(server + "/models").json()["models"] if m["model"] == "qm9")["length"]
    template = "C=1CC=2ccnnc21" + "[PAD]" * (length - 14)  # 14 tokens: every position known
    r = httpx.post(server + "/generate", json=dict(model="qm9", num_samples=2, steps=1, seed=0, prompt=template))
    assert r.status_code == 200, r.text
    assert [(s["text"], s["valid"], s["qed"], s["canonical"]) for s in r.json()["samples"]] == \
        [("C=1CC=2ccnnc21", False, None, None)] * 2
    r = httpx.get(server + "/depict", params={"smiles": "C=1CC=2ccnnc21"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "smiles"], r.text


def test_every_documented_error_has_the_body_the_server_sends(server):
    """Each error status in /openapi.json has a body schema (FastAPI documents none for a route's own answers):
    native 422 FastAPI's field errors, other native errors ``detail``, /v1 OpenAI's error object; and real
    answers of each shape validate against the schema the document gives them."""
    import jsonschema

    spec = httpx.get(server + "/openapi.json").json()
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            for code, answer in op["responses"].items():
                if code.startswith(("4", "5")):
                    assert "application/json" in answer.get("content", {}), (method, path, code)

    def check(path: str, method: str, r: httpx.Response):
        ref = spec["paths"][path][method]["responses"][str(r.status_code)]["content"]["application/json"]["schema"]
        jsonschema.validate(r.json(), {**ref, "components": spec["components"]},
                            cls=jsonschema.Draft202012Validator)

    check("/generate", "post", httpx.post(server + "/generate", json={"model": "nope"}))  # 404, with available
    check("/generate", "post", httpx.post(server + "/generate", json={"steps": 0}))  # 422
    check("/generate", "post", httpx.post(server + "/generate", content=b"{",
                                          headers={"content-type": "application/json"}))  # 400
    check("/depict", "get", httpx.get(server + "/depict", params={"smiles": "C1CC"}))  # the handler's own 422
    check("/v1/completions", "post", httpx.post(server + "/v1/completions", json={"model": "nope", "prompt": "C"}))
    check("/v1/completions", "post", httpx.post(server + "/v1/completions", json={"prompt": 3}))
    for path in ("/v1/completions", "/generate"):  # not UTF-8: FastAPI's own 400, in the route's shape
        bad = httpx.post(server + path, content=b"\xff\x15", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "UTF-8" in bad.text, bad.text
        check(path, "post", bad)
    check("/health", "get", httpx.get(server + "/health"))


def test_the_playground_page_is_served_with_a_content_security_policy(server):
    page = httpx.get(server + "/")
    assert page.status_code == 200 and "playground.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    js = httpx.get(server + "/playground/playground.js")
    assert js.status_code == 200 and "step_tokens: true" in js.text
    assert httpx.get(server + "/playground/nope.js").status_code == 404


def test_valid_only_answers_what_it_found_when_the_deadline_passes_in_a_later_round(server):
    """The review's fuzz case ran valid_only's rounds into the deadline and answered 504, discarding the
    molecules already found: now 200 with them, and `stopped_early` says why there are fewer."""
    from service.speed import WALL_HEADROOM

    body = dict(model="qm9", decomposition="tt", num_samples=64, steps=64, seed=9)
    one_round = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        assert httpx.post(server + "/generate", json=body, timeout=120).status_code == 200
        one_round = max(one_round, time.perf_counter() - t0)
    info = next(m for m in httpx.get(server + "/models").json()["models"] if m["checkpoint"] == "qm9-tt-r2")
    timed = info["estimated_timed_rows"]["predetermined_step"]
    rows = min(64, timed) + 1.3 * max(64 - timed, 0)  # sequences beyond the timed ones cost 1.3x
    admitted_at = min(64, info["length"]) * (info["estimated_step_overhead_seconds"]["predetermined_step"]
                                             + rows * info["estimated_seconds"]["predetermined_step"])  # admission's
    # the first round is admitted (admission asks the estimate times WALL_HEADROOM to fit); all four rarely fit
    timeout = max(1.8 * one_round, 1.1 * WALL_HEADROOM * admitted_at)
    r = httpx.post(server + "/generate", json=dict(body, valid_only=True, timeout_s=timeout), timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["rounds"] >= 1 and answer["drawn"] == 64 * answer["rounds"]
    assert all(s["valid"] for s in answer["samples"])
    if answer["stopped_early"]:
        assert answer["stopped_early"] == "deadline" and len(answer["samples"]) < 64 and answer["rounds"] < 4
    else:  # every round it needed fit the deadline
        assert len(answer["samples"]) == 64 or answer["rounds"] == 4

