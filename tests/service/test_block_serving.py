"""Block diffusion through a real server: a block checkpoint with a TT head over each block (named by
``checkpoint``; ``sampler: blocks`` and one step a block by default: each block one exact joint draw), streamed and
batched like any other; what it cannot run is refused with a 422 naming the field."""

import json
import re

import httpx
import pytest
import torch
from servers import SAMPLE, TINY, uvicorn_server

pytestmark = pytest.mark.slow  # a real server


@pytest.fixture(scope="module")
def block_server(tmp_path_factory):
    from _loop import fit

    from ttcore.data import SmilesDataset
    from ttcore.models import JointModel, ModelConfig
    from ttcore.recipes import load_config

    root = tmp_path_factory.mktemp("block-checkpoints")
    cfg = load_config(TINY, ["threads=1", "val_batches=1", "model.block_size=2"])
    ds = SmilesDataset.from_file(SAMPLE)
    tok = ds.tokenizer
    torch.manual_seed(0)
    base = JointModel(ModelConfig(cfg.model.dit_config(tok), extra={"family": "qm9"}))
    data = torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens)
    fit(base, tok, *data, cfg, root / "qm9-b2-base", max_steps=20, quiet=True)
    tt = JointModel.from_base(base, "tt", 2, "1layer", 0.05, torch.Generator().manual_seed(0))
    fit(tt, tok, *data, cfg, root / "qm9-b2-tt", max_steps=10, quiet=True)
    with uvicorn_server(root) as url:
        yield url, tok, root


def test_a_block_checkpoint_is_served_block_by_block(block_server):
    url, tok, _ = block_server
    infos = {m["checkpoint"]: m for m in httpx.get(url + "/models").json()["models"]}
    assert infos["qm9-b2-tt"]["kind"] == "block_diffusion" and infos["qm9-b2-tt"]["base"] == "bd3lm"
    blocks = tok.length // 2
    assert infos["qm9-b2-tt"]["block_size"] == 2 and infos["qm9-b2-tt"]["default_steps"] == blocks
    r = httpx.post(url + "/generate", json={"checkpoint": "qm9-b2-tt", "num_samples": 3, "seed": 0}, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["steps"] == blocks and answer["tokens_per_step"] == [6] * blocks  # 3 sequences x 2 a step
    two = httpx.post(url + "/generate", json={"checkpoint": "qm9-b2-tt", "num_samples": 3, "seed": 0,
                                             "steps": 2 * blocks, "ordering": "left_to_right"}, timeout=60)
    assert two.status_code == 200 and two.json()["tokens_per_step"] == [3] * (2 * blocks), two.text
    events = []
    body = {"checkpoint": "qm9-b2-tt", "num_samples": 2, "seed": 1, "stream": True}
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as s:
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert len(events) == blocks + 1  # a step event a block, then the answer
    first = events[0]["committed"][0]  # the first step commits the first block
    assert sorted(first) == [0, 1]


def test_a_block_request_gets_its_own_tokens_beside_others(block_server):
    """Batch invariance: the same seeded request alone and while others (at another k) run gives the same
    samples."""
    import concurrent.futures

    url, tok, _ = block_server
    body = {"checkpoint": "qm9-b2-tt", "num_samples": 4, "seed": 7}
    eb = {"checkpoint": "qm9-b2-tt", "num_samples": 4, "seed": 8, "block_eb_gamma": 0.5, "steps": tok.length}
    alone = [httpx.post(url + "/generate", json=b, timeout=60).json()["samples"] for b in (body, eb)]
    other = {"checkpoint": "qm9-b2-tt", "num_samples": 3, "steps": tok.length}  # two steps a block
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(httpx.post, url + "/generate", json=b, timeout=60)
                   for b in [dict(other, seed=1), body, dict(other, seed=2), eb, dict(other, seed=3)]]
        answers = [f.result() for f in futures]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert [s["text"] for s in answers[1].json()["samples"]] == [s["text"] for s in alone[0]]
    assert [s["text"] for s in answers[3].json()["samples"]] == [s["text"] for s in alone[1]]


def test_eb_and_adaptive_orderings_inside_a_block_are_served(block_server):
    """``block_eb_gamma`` (EB-Sampler inside each block, ``steps`` its cap) and ``ordering: top_prob`` at two steps
    a block: every position drawn; EB's steps at least the blocks and at most the cap, and streamed, each step's
    tokens of a sequence inside one block, the blocks in order."""
    url, tok, _ = block_server
    blocks = tok.length // 2
    body = {"checkpoint": "qm9-b2-tt", "num_samples": 3, "seed": 4, "block_eb_gamma": 0.5, "steps": tok.length}
    r = httpx.post(url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert blocks <= answer["steps"] <= tok.length and sum(answer["tokens_per_step"]) == 3 * tok.length
    with httpx.stream("POST", url + "/generate", json=dict(body, stream=True), timeout=60) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    steps = [e["committed"] for e in events if "committed" in e]
    for row in range(3):
        blocks_drawn = [{p // 2 for p in step[row]} for step in steps if step[row]]
        assert all(len(b) == 1 for b in blocks_drawn) and [min(b) for b in blocks_drawn] == sorted(
            min(b) for b in blocks_drawn)
    adaptive = httpx.post(url + "/generate", json={"checkpoint": "qm9-b2-tt", "num_samples": 3, "seed": 4,
                                                   "ordering": "top_prob", "steps": tok.length}, timeout=60)
    assert adaptive.status_code == 200 and adaptive.json()["tokens_per_step"] == [3] * tok.length, adaptive.text


@pytest.mark.parametrize("extra,field", [({"steps": 7}, "steps"), ({"steps": 3, "block_eb_gamma": 0.5}, "steps"),
                                         ({"block_eb_gamma": -1}, "block_eb_gamma"),
                                         ({"prompt": "[MASK][MASK]C"}, "prompt"),
                                         ({"sampler": "fixed"}, "sampler"), ({"schedule": "cosine"}, "schedule"),
                                         ({"joint": False, "regex": "C+"}, "joint")])
def test_what_a_block_model_cannot_run_is_a_422_naming_the_field(block_server, extra, field):
    url, _, _ = block_server
    r = httpx.post(url + "/generate", json={"checkpoint": "qm9-b2-tt", "num_samples": 2, **extra}, timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == field, r.text


def test_a_prompt_is_prefilled_and_its_first_masked_block_drawn_given_it(block_server):
    """A prompt of three tokens over blocks of 2: block 0 given (no step runs for it), block 1 drawn given its
    known first token; every sample keeps the prompt."""
    url, tok, _ = block_server
    r = httpx.post(url + "/generate", json={"checkpoint": "qm9-b2-tt", "num_samples": 3, "seed": 0,
                                            "prompt": "CCO"}, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert all(s["text"].startswith("CCO") for s in answer["samples"]), answer
    blocks = tok.length // 2
    per_step = answer["tokens_per_step"]  # the steps that ran: block 0's was skipped
    assert len(per_step) == blocks - 1 and per_step[0] == 3 and sum(per_step) == 3 * (tok.length - 3), answer


def test_a_grammar_constrains_every_block(block_server):
    """``grammar: smiles`` (and a regex) on a block checkpoint: each block drawn from its joint restricted to what
    the language can still accept, so every sample is in it, at one and two steps a block, by EB inside the block
    and by an adaptive ordering."""
    from servers import assert_in_language

    url, tok, _ = block_server
    assert_in_language(url, "qm9-b2-tt", tok, ({"grammar": "smiles"}, {"grammar": "smiles", "steps": tok.length},
                                              {"regex": "C+(O|N)C*"},
                                              {"grammar": "smiles", "block_eb_gamma": 0.5, "steps": tok.length},
                                              {"grammar": "smiles", "ordering": "margin", "steps": tok.length}), 16, 0)


def test_score_gives_a_block_models_exact_likelihood(block_server):
    """/score on a block checkpoint: the exact log p(x) of the k = 1 sampler's law (the library's
    ``block_score`` of the same tokens), a template's [MASK]s scored given its known positions when every block
    after the first scored one is scored whole; otherwise, and for the ELBO, a 422 naming the field."""
    from ttcore.models import load_checkpoint
    from ttcore.sampling.blocks import block_score

    url, tok, root = block_server
    model, _, _ = load_checkpoint(root / "qm9-b2-tt")
    seqs = ["CCO", "C1CC1"]
    r = httpx.post(url + "/score", json={"checkpoint": "qm9-b2-tt", "sequences": seqs}, timeout=60)
    assert r.status_code == 200, r.text
    x0 = torch.tensor([tok.tokenize(q) + [tok.pad_id] * (tok.length - len(tok.tokenize(q))) for q in seqs])
    with torch.no_grad():
        want, _ = block_score(model.eval(), x0, torch.ones_like(x0, dtype=torch.bool))
    got = [s["log_prob"] for s in r.json()["scores"]]
    assert got == pytest.approx(want.tolist(), abs=1e-4)
    rest = "[MASK]" * (tok.length - 2)  # a template's positions after its end are known: it runs to the length
    inside = httpx.post(url + "/score", json={"checkpoint": "qm9-b2-tt", "sequences": ["CCO"],
                                              "template": "[MASK]C" + rest}, timeout=60)  # known inside block 0
    assert inside.status_code == 200, inside.text
    terms = inside.json()["scores"][0]["token_log_probs"]
    assert terms[1] is None and all(v is not None for v in terms[:1] + terms[2:])
    after = httpx.post(url + "/score", json={"checkpoint": "qm9-b2-tt", "sequences": ["CCO"],
                                             "template": "[MASK][MASK]O" + rest[6:]}, timeout=60)  # O known after
    # the first scored block
    assert after.status_code == 422 and after.json()["detail"][0]["loc"][-1] == "template", after.text
    assert "whole blocks after the first scored one" in after.text
    elbo = httpx.post(url + "/score", json={"checkpoint": "qm9-b2-tt", "sequences": ["CCO"], "mode": "elbo"},
                      timeout=60)
    assert elbo.status_code == 422 and elbo.json()["detail"][0]["loc"][-1] == "mode", elbo.text


def test_text_from_a_block_checkpoint_ends_at_its_end_of_text(tmp_path):
    """A text block checkpoint (its end-of-text made likely), served in float32: each answer is the text of the
    in-process run with the tokenizer's end-of-text as ``stop_token`` (the same seed, counter-based streams: the
    same tokens up to the first block holding it, end-of-text after), which differs from the run that draws every
    block; a constrained request draws every block (the constraint decides the tail)."""
    from ttcore.data import training_texts
    from ttcore.models import DiTConfig, JointModel, ModelConfig, save_checkpoint
    from ttcore.sampling import GenerationRun, SamplerConfig
    from ttcore.tokenizers.text import train_bpe

    tok = train_bpe(training_texts()[:20], vocab_size=300, length=16)
    torch.manual_seed(0)
    dit = DiTConfig.for_tokenizer(tok, hidden_dim=32, cond_dim=16, n_blocks=1, n_heads=2, block_size=4)
    model = JointModel(ModelConfig(dit, extra={"family": "text"})).eval()
    with torch.no_grad():
        model.output_layer.linear.bias[tok.eot_id] = 4.0  # end-of-text likely
    save_checkpoint(tmp_path / "text-b4", model, tok)

    def texts(stop, n, seed=0):
        run = GenerationRun(model, n, 4, SamplerConfig(sampler="blocks"), seed=seed, stop_token=stop)
        while not run.done:
            run.step()
        return [tok.decode(row.tolist()) for row in run.tokens], run.tokens

    stopped, tokens = texts(tok.eot_id, 16)
    drawn, _ = texts(None, 16)
    assert stopped != drawn and bool((tokens[:, 12:] == tok.eot_id).any())  # some sequences ended early
    with uvicorn_server(tmp_path, "--precision", "fp32") as url:
        r = httpx.post(url + "/generate", json={"checkpoint": "text-b4", "num_samples": 16, "seed": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert [s["text"] for s in r.json()["samples"]] == stopped
        r = httpx.post(url + "/generate", json={"checkpoint": "text-b4", "num_samples": 4, "seed": 0,
                                                "regex": "[a-z ]+"}, timeout=60)
        assert r.status_code == 200, r.text
        assert all(re.fullmatch("[a-z ]+", s["text"]) for s in r.json()["samples"])
