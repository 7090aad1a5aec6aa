"""Structured output through a real server: ``regex`` and ``grammar`` on /generate and /v1/completions, every
sample inside its language, and what a stranger sends refused with a 422 naming the field (never a 500)."""

import re

import httpx
import pytest

from ttcore.constraints import smiles_dfa
from ttcore.tokenizers import load_tokenizer

pytestmark = pytest.mark.slow  # a real server


def _grammar(checkpoints, name):
    tok = load_tokenizer(checkpoints / name)
    return tok, smiles_dfa(tok.pieces(range(tok.vocab_size)), tok.pad_id)


@pytest.mark.parametrize("checkpoint", ["qm9-base", "qm9-cp-r3", "qm9-tt-r2"])
def test_every_sample_is_in_the_grammar_and_matches_the_regex(server, checkpoints, checkpoint):
    from servers import assert_in_language

    tok = load_tokenizer(checkpoints / checkpoint)
    assert_in_language(server, checkpoint, tok, (
        {"grammar": "smiles", "steps": 4}, {"grammar": "smiles", "steps": 2, "ordering": "top_prob"},
        {"grammar": "smiles", "steps": 8, "sampler": "eb"}, {"regex": "C+(O|N)C*", "steps": 3}), 24, 5)
    infos = {m["checkpoint"]: m for m in httpx.get(server + "/models").json()["models"]}
    assert infos[checkpoint]["grammars"] == ["smiles"] and infos["text-base"]["grammars"] == []


def test_a_streamed_constrained_run_and_a_completion_after_a_prefix(server):
    pattern = r"[0-9]{2}-[0-9]{2}"
    with httpx.stream("POST", server + "/generate", json={"model": "text", "num_samples": 2, "steps": 4, "seed": 1,
                                                          "regex": pattern, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        done = [line for line in r.iter_lines() if line.startswith("data:") and '"samples"' in line]
    assert done and all(re.fullmatch(pattern, t) for t in re.findall(r'"text":\s*"([^"]*)"', done[-1]))
    c = httpx.post(server + "/v1/completions", json={"model": "text", "prompt": "Born in ", "n": 2, "seed": 2,
                                                     "regex": " [0-9]{4}\\."}, timeout=120)
    assert c.status_code == 200, c.text
    assert all(re.fullmatch(r" [0-9]{4}\.", ch["text"]) for ch in c.json()["choices"]), c.json()
    body = {"model": "text", "num_samples": 2, "steps": 4, "seed": 1, "regex": pattern}
    once, twice = (httpx.post(server + "/generate", json=body, timeout=120).json()["samples"] for _ in range(2))
    assert once == twice  # seeded


BAD = [
    ({"regex": "(ab"}, "regex", "not a regular expression"),
    ({"regex": "(?=C)C"}, None, None),  # interegular reads a look-ahead that keeps the language regular
    ({"regex": "(C)\\1"}, "regex", "not a regular expression"),
    ({"regex": ""}, "regex", ""),
    ({"regex": "x" * 1001}, "regex", ""),
    ({"regex": "é+"}, "regex", "empty"),
    ({"regex": "C{30}"}, "regex", "tokens is in the language"),
    ({"regex": "[CO]{1,9}[CN]{1,9}[CF]{1,9}[C=]{1,9}"}, None, None),  # fine: many states, still satisfiable
    ({"regex": "C", "grammar": "smiles"}, "grammar", "not both"),
    ({"grammar": "json"}, "grammar", ""),
    ({"grammar": "smiles", "model": "text"}, "grammar", "not offered"),
    ({"regex": "C+", "prompt": "O[MASK]"}, "prompt", "agrees with the prompt"),
    ({"grammar": "smiles", "joint": False}, "joint", "joint draw"),
    ({"grammar": "smiles", "ordering": "top_prob", "adaptive_path": "exact"}, "adaptive_path", "fast"),
    ({"regex": 5}, "regex", ""),
]


@pytest.mark.parametrize("extra,field,says", BAD, ids=[str(b[0])[:40] for b in BAD])
def test_what_a_stranger_sends_is_refused_naming_the_field(server, extra, field, says):
    r = httpx.post(server + "/generate", json={"model": "qm9", "num_samples": 2, "steps": 2, **extra}, timeout=120)
    if field is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][-1] == field and says in d["msg"] for d in detail), detail


def test_a_pattern_whose_automaton_explodes_is_refused_and_the_server_goes_on(server):
    """A nested counted repetition (interegular takes minutes) and an exponential subset construction: each
    refused 422 after the build's time limit, two at once, while a plain request is answered meanwhile."""
    import concurrent.futures
    import time  # the builds' head start only: nothing here compares durations

    slow = ["((C{1,50}){1,50}){1,50}", "(C|O)*C(C|O){20}"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        sent = [pool.submit(httpx.post, server + "/generate", json={"model": "qm9", "num_samples": 2, "regex": p},
                            timeout=60) for p in slow]
        time.sleep(0.5)
        plain = httpx.post(server + "/generate", json={"model": "qm9", "num_samples": 2, "steps": 2}, timeout=60)
        pending = sum(not f.done() for f in sent)  # the builds run to their limit: still going
        answers = [f.result() for f in sent]
    assert plain.status_code == 200 and pending == 2, pending  # answered while both builds went on
    for r in answers:
        assert r.status_code == 422 and "to build" in r.text, r.text


def test_a_completion_cut_by_max_tokens_is_refused_with_a_constraint(server):
    r = httpx.post(server + "/v1/completions", json={"model": "text", "prompt": "Hi", "max_tokens": 3,
                                                     "regex": "[a-z ]+"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text  # OpenAI's invalid request


def test_every_bundled_checkpoint_generates_inside_its_constraint_through_both_apis():
    """The bundled checkpoints as served (precision auto, the default): each SMILES one with its grammar, the text
    one with a regex, on /generate and on /v1/completions."""
    from pathlib import Path

    from servers import start_uvicorn

    root = Path(__file__).resolve().parents[2] / "checkpoints"
    proc, url = start_uvicorn(root, "--precision", "auto")
    try:
        for info in httpx.get(url + "/models").json()["models"]:
            name = info["checkpoint"]
            constraint = {"grammar": "smiles"} if info["grammars"] else {"regex": "[a-z]+( [a-z]+)?\\."}
            steps = info["default_steps"] if info["block_size"] else 2  # a block model's steps are k per block
            gen = httpx.post(url + "/generate", json={"checkpoint": name, "num_samples": 2, "steps": steps, "seed": 0,
                                                      **constraint}, timeout=300)
            v1 = httpx.post(url + "/v1/completions", json={"model": name, "prompt": "", "n": 2, "seed": 0,
                                                           "steps": steps, **constraint}, timeout=300)
            assert gen.status_code == 200 and v1.status_code == 200, (name, gen.text[:300], v1.text[:300])
            texts = [s["text"] for s in gen.json()["samples"]] + [c["text"] for c in v1.json()["choices"]]
            if "regex" in constraint:
                assert all(re.fullmatch(constraint["regex"], t) for t in texts), (name, texts)
            else:
                tok, grammar = _grammar(root, name)
                assert all(grammar.accepts(tok.encode(t)) for t in texts), (name, texts)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
