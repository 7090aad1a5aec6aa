"""The autoregressive baselines through a real server: a family's AR checkpoint (``base: ar``, named by
``checkpoint``; one token a step, left to right, its length as the default steps) and the samplers that consult it,
``edlm`` and ``dcd``, over the diffusion checkpoint it is paired with (``ar_pair`` in ``GET /models``); what either
cannot run is refused with a 422 naming the field."""

import shutil

import httpx
import pytest
import torch
from common import lone_run_texts
from servers import make_ar_checkpoint, uvicorn_server

pytestmark = pytest.mark.slow  # a real server


@pytest.fixture(scope="module")
def ar_root(checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("ar-checkpoints")
    shutil.copytree(checkpoints / "qm9-base", root / "qm9-base")
    make_ar_checkpoint(root / "qm9-ar", root / "qm9-base")
    return root


@pytest.fixture(scope="module")
def ar_server(ar_root):
    with uvicorn_server(ar_root) as url:
        yield url


def _refused(r, field: str, says: str):
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][-1] == field and says in d["msg"] for d in detail), detail


def test_models_show_the_ar_checkpoint_and_the_pair(ar_server):
    infos = {m["checkpoint"]: m for m in httpx.get(ar_server + "/models").json()["models"]}
    assert infos["qm9-ar"]["base"] == "ar" and infos["qm9-ar"]["head"] == "ar"
    assert infos["qm9-base"]["ar_pair"] == "qm9-ar" and infos["qm9-ar"]["ar_pair"] is None


def test_the_ar_checkpoint_generates_one_token_a_step(ar_server):
    r = httpx.post(ar_server + "/generate", json={"checkpoint": "qm9-ar", "num_samples": 4, "seed": 1}, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    length = {m["checkpoint"]: m for m in httpx.get(ar_server + "/models").json()["models"]}["qm9-ar"]["length"]
    assert out["checkpoint"] == "qm9-ar" and out["steps"] == length
    assert all("[MASK]" not in s["text"] for s in out["samples"])
    again = httpx.post(ar_server + "/generate", json={"checkpoint": "qm9-ar", "num_samples": 4, "seed": 1}, timeout=120)
    assert again.json()["samples"] == out["samples"]
    prefix = httpx.post(ar_server + "/generate", json={"checkpoint": "qm9-ar", "num_samples": 3, "seed": 2,
                                                      "prompt": "CC"}, timeout=120)
    assert prefix.status_code == 200 and all(s["text"].startswith("CC") for s in prefix.json()["samples"])
    plain = httpx.post(ar_server + "/generate", json={"model": "qm9", "num_samples": 1, "steps": 2}, timeout=120)
    assert plain.json()["checkpoint"] == "qm9-base"  # the AR checkpoint answers only when named


def test_served_steps_from_the_cache_draw_what_the_whole_sequence_does(ar_server, ar_root):
    """Concurrent requests (batched steps, runs joining at different steps, each step from the key-value caches)
    get the tokens a lone run without a cache draws."""
    from concurrent.futures import ThreadPoolExecutor

    length = {m["checkpoint"]: m for m in httpx.get(ar_server + "/models").json()["models"]}["qm9-ar"]["length"]
    bodies = [{"checkpoint": "qm9-ar", "num_samples": n, "seed": s, "steps": length, "ordering": "left_to_right",
               **({"prompt": p} if p else {})} for n, s, p in ((3, 5, None), (2, 6, "CC"), (4, 7, "C1"), (1, 8, None))]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: httpx.post(ar_server + "/generate", json=b, timeout=120), bodies))
    for body, r in zip(bodies, answers):
        assert r.status_code == 200, r.text
        assert [s["text"] for s in r.json()["samples"]] == lone_run_texts(ar_root / "qm9-ar", body, kv_cache=False)


def test_a_request_that_sits_out_steps_rebuilds_its_cache(ar_root):
    """The real engine and Serving, in process: a reader that stops reading pauses its request after
    ``MAX_BACKLOG`` unread steps; the request's key-value cache is dropped while it sits out, refilled by a prefill
    when the reader reads again, and the answer is a lone uncached run's."""
    import asyncio

    from service.batcher import MAX_BACKLOG
    from service.engine import Engine
    from service.registry import ModelRegistry
    from service.schema import GenerateRequest
    from service.serving import Serving

    serving = Serving(ModelRegistry(ar_root, "cpu", "fp32"), Engine())
    body = {"checkpoint": "qm9-ar", "num_samples": 2, "seed": 31, "ordering": "left_to_right"}

    async def slow_reader():
        ticket = serving.submit(GenerateRequest(**body))
        events, dropped = serving.events(ticket), None
        first = await anext(events)
        for _ in range(100):  # the request runs MAX_BACKLOG steps ahead of its reader, then sits out
            await asyncio.sleep(0.05)
            if ticket.job.outputs.qsize() >= MAX_BACKLOG and ticket.job.run.kv is None:
                dropped = ticket.job.run.step_index
                break
        return first, [e async for e in events], dropped, ticket.job.run.steps

    first, rest, dropped, steps = asyncio.run(slow_reader())
    assert dropped is not None and dropped < steps  # it sat out with its cache dropped before it was done
    answer = rest[-1]
    assert type(answer).__name__ == "GenerateResponse"
    length = answer.steps
    assert [s.text for s in answer.samples] == lone_run_texts(ar_root / "qm9-ar", dict(body, steps=length),
                                                              kv_cache=False)


@pytest.mark.parametrize("body, field, says", [
    ({"ordering": "random"}, "ordering", "left to right"),
    ({"steps": 3}, "steps", "steps must be >="),
    ({"grammar": "smiles"}, "grammar", "autoregressive"),
    ({"prompt": "[MASK]C"}, "prompt", "prefix only"),
    ({"sampler": "edlm"}, "sampler", "one token a step"),
    ({"schedule": "cosine"}, "schedule", "schedule must be 'loglinear'"),
])
def test_the_ar_checkpoint_refuses_what_it_cannot_run(ar_server, body, field, says):
    r = httpx.post(ar_server + "/generate", json={"checkpoint": "qm9-ar", "num_samples": 2, **body}, timeout=60)
    _refused(r, field, says)


def test_the_openai_api_names_the_ar_checkpoint_apart(ar_server):
    ids = [m["id"] for m in httpx.get(ar_server + "/v1/models").json()["data"]]
    assert len(ids) == len(set(ids)) and "qm9-ar" in ids
    r = httpx.post(ar_server + "/v1/completions", json={"model": "qm9-ar", "prompt": "CC", "n": 2, "seed": 1,
                                                        "echo": True}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "qm9-ar" and all(c["text"].startswith("CC") for c in r.json()["choices"])


def test_score_gives_the_ar_checkpoints_exact_likelihood(ar_server, ar_root):
    from ttcore.kinds.autoregressive import ar_log_prob
    from ttcore.models import load_checkpoint

    r = httpx.post(ar_server + "/score", json={"checkpoint": "qm9-ar", "sequences": ["CCO", "c1ccccc1"]}, timeout=60)
    assert r.status_code == 200, r.text
    scores = r.json()["scores"]
    infos = {m["checkpoint"]: m for m in httpx.get(ar_server + "/models").json()["models"]}
    length = infos["qm9-ar"]["length"]
    model, tok, _ = load_checkpoint(ar_root / "qm9-ar")  # the served weights (the server runs fp32)
    x = torch.tensor([tok.encode(s) for s in ("CCO", "c1ccccc1")])
    with torch.no_grad():
        expected = ar_log_prob(model.eval(), x).double()
    assert [s["tokens"] for s in scores] == [length, length]
    assert all(abs(s["log_prob"] - e) < 1e-3 for s, e in zip(scores, expected.tolist())), (scores, expected)
    assert abs(sum(scores[0]["token_log_probs"]) - scores[0]["log_prob"]) < 1e-4
    prefix = httpx.post(ar_server + "/score", json={"checkpoint": "qm9-ar", "sequences": ["CCO"],
                                                    "template": "CC" + "[MASK]" * (length - 2)}, timeout=60)
    assert prefix.status_code == 200, prefix.text
    tl = scores[0]["token_log_probs"]
    assert abs(prefix.json()["scores"][0]["log_prob"] - sum(tl[2:])) < 1e-4  # log p(x^{2:} | CC), exact
    _refused(httpx.post(ar_server + "/score", json={"checkpoint": "qm9-ar", "sequences": ["CCO"],
                                                    "template": "C[MASK]O"}, timeout=60), "template", "suffix")
    _refused(httpx.post(ar_server + "/score", json={"checkpoint": "qm9-ar", "sequences": ["CCO"], "mode": "elbo"},
                        timeout=60), "mode", "exact")


@pytest.mark.parametrize("sampler", ["edlm", "dcd"])
def test_edlm_and_dcd_over_the_pair(ar_server, sampler):
    body = {"checkpoint": "qm9-base", "num_samples": 4, "steps": 4, "seed": 3, "sampler": sampler,
            "edlm_candidates": 3}
    r = httpx.post(ar_server + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert all("[MASK]" not in s["text"] for s in r.json()["samples"])
    assert httpx.post(ar_server + "/generate", json=body, timeout=120).json()["samples"] == r.json()["samples"]
    _refused(httpx.post(ar_server + "/generate", json={**body, "ordering": "entropy"}, timeout=60), "ordering",
             "predetermined")
    _refused(httpx.post(ar_server + "/generate", json={**body, "regex": "C+"}, timeout=60), "regex", sampler)
    r = httpx.post(ar_server + "/generate", json={**body, "edlm_candidates": 0}, timeout=60)
    assert r.status_code == 422 and "edlm_candidates" in r.text


def test_edlm_over_a_served_tt_draws_its_joint_candidates(checkpoints, ar_root, tmp_path):
    """The real engine and Serving, in process, over a TT checkpoint paired with the AR one: ``sampler: edlm``
    answers with the library's EDLM over the joint (its candidates the TT's own draws), in a batch with a plain
    request and a rank-1 EDLM request, and at a temperature (the rank-1 view's proposals) too."""
    import asyncio

    from service.engine import Engine
    from service.refusals import Unsupported
    from service.registry import ModelRegistry
    from service.schema import GenerateRequest
    from service.serving import Serving
    from ttcore.kinds import pair
    from ttcore.models import load_for_inference
    from ttcore.sampling import GenerationRun

    root = tmp_path / "tt-and-ar"
    root.mkdir()
    for name in ("qm9-tt-r2",):
        shutil.copytree(checkpoints / name, root / name)
    shutil.copytree(ar_root / "qm9-ar", root / "qm9-ar")
    shutil.copytree(ar_root / "qm9-base", root / "qm9-base")
    serving = Serving(ModelRegistry(root, "cpu", "fp32"), Engine())
    bodies = [{"checkpoint": "qm9-tt-r2", "num_samples": 5, "steps": 4, "seed": 8, "sampler": "edlm"},
              {"checkpoint": "qm9-tt-r2", "num_samples": 3, "steps": 4, "seed": 9},
              {"checkpoint": "qm9-base", "num_samples": 2, "steps": 4, "seed": 10, "sampler": "edlm"},
              {"checkpoint": "qm9-tt-r2", "num_samples": 3, "steps": 4, "seed": 11, "sampler": "edlm",
               "temperature": 0.7},
              {"checkpoint": "qm9-tt-r2", "num_samples": 5, "steps": 4, "seed": 8, "sampler": "edlm", "joint": False,
               "contraction": "exact"}]  # the rank-1 view's proposals: its exact marginals

    async def together():
        tickets, out = [serving.submit(GenerateRequest(**b)) for b in bodies], []
        for t in tickets:  # all four step in the engine's batches while the first is read
            out.append([e async for e in serving.events(t, steps=False)][-1])
        return out

    answers = asyncio.run(together())
    tt, tok, _ = load_for_inference(root / "qm9-tt-r2", "cpu", "fp32")
    pair(tt, load_for_inference(root / "qm9-ar", "cpu", "fp32")[0])
    for body, answer in zip(bodies, answers):
        assert type(answer).__name__ == "GenerateResponse", answer
        if body["checkpoint"] != "qm9-tt-r2":
            continue
        run = GenerationRun(tt, body["num_samples"], 4, GenerateRequest(**body).to_sampler_config(), seed=body["seed"])
        with tt.compute_context():
            while not run.done:
                run.step()
        assert [s.text for s in answer.samples] == [tok.decode(row) for row in run.tokens.tolist()]
    assert [s.text for s in answers[0].samples] != [s.text for s in answers[-1].samples]  # joint: false is honoured
    with pytest.raises(Unsupported, match="contraction applies only"):  # the joint proposals sum nothing out
        serving.submit(GenerateRequest(**dict(bodies[0], contraction="exact")))


def test_edlm_without_an_ar_checkpoint_is_refused(server):
    r = httpx.post(server + "/generate", json={"model": "qm9", "num_samples": 2, "sampler": "edlm"}, timeout=60)
    _refused(r, "sampler", "paired")
    _refused(r, "sampler", "training/train_ar.py makes one")  # the 422 says how to get one


def test_dcd_chunks_through_the_server(ar_server):
    body = {"checkpoint": "qm9-base", "num_samples": 2, "steps": 4, "seed": 3, "sampler": "dcd", "dcd_chunk": 4}
    r = httpx.post(ar_server + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    _refused(httpx.post(ar_server + "/generate", json={**body, "sampler": "edlm"}, timeout=60), "dcd_chunk",
             "sampler dcd")
