"""POST /score against the library on the same checkpoint (a live uvicorn server, fp32)."""

import math

import httpx
import pytest
import torch

from ttcore.models import load_for_inference
from ttcore.scoring import elbo, score

pytestmark = pytest.mark.slow  # a server


def test_joint_scores_match_the_library_and_templates_choose_the_positions(server, checkpoints):
    seqs = ["CC(=O)O", "c1ccccc1", "CCN"]
    r = httpx.post(server + "/score", json={"model": "qm9", "decomposition": "tt", "sequences": seqs}, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["checkpoint"] == "qm9-tt-r2" and answer["mode"] == "joint"
    model, tok, _ = load_for_inference(checkpoints / "qm9-tt-r2", "cpu", "fp32")
    x0 = torch.tensor([tok.encode(s) for s in seqs])
    with model.compute_context():
        log_prob, token = score(model, x0, torch.ones_like(x0, dtype=torch.bool))
    for s, lp, tl in zip(answer["scores"], log_prob.tolist(), token.tolist()):
        assert s["log_prob"] == pytest.approx(lp, rel=1e-6) and len(s["token_log_probs"]) == tok.length
        assert s["token_log_probs"] == pytest.approx(tl, rel=1e-6)
        assert s["log_prob"] <= max(s["token_log_probs"])  # a joint is no likelier than any of its marginals
    t = httpx.post(server + "/score", json={"model": "qm9", "sequences": ["CC(=O)O"], "template": "CC[MASK]"},
                   timeout=60).json()["scores"][0]
    # the template's [MASK] alone is scored; every other position, after its end too, keeps the sequence's
    assert [i for i, v in enumerate(t["token_log_probs"]) if v is not None] == [2]
    assert t["log_prob"] == pytest.approx(t["token_log_probs"][2])  # one position: its marginal
    assert math.exp(t["log_prob"]) > math.exp(answer["scores"][0]["log_prob"])  # fewer positions to predict
    one = httpx.post(server + "/score", json={"model": "qm9", "sequences": ["CC(CO)O"], "template": "CC([MASK]O)O"},
                     timeout=60).json()["scores"][0]  # the review's example scored 16 positions, not 1
    assert sum(v is not None for v in one["token_log_probs"]) == 1 and one["real_tokens"] == 7


def test_elbo_mode_and_bad_sequences(server):
    body = {"model": "qm9", "sequences": ["CC(=O)O", "CCN"], "mode": "elbo", "num_mc": 8, "seed": 3}
    a = httpx.post(server + "/score", json=body, timeout=60).json()["scores"]
    b = httpx.post(server + "/score", json=body, timeout=60).json()["scores"]
    assert a == b and all(s["nelbo_per_token"] > 0 and s["stderr"] > 0 for s in a)  # seeded: reproducible
    assert all(s["nelbo_terms"] == "all" for s in a)  # SMILES end in padding, which the model generates
    bad = httpx.post(server + "/score", json={"model": "qm9", "sequences": ["CC", "CXC"]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "sequences", 1]
    long = httpx.post(server + "/score", json={"model": "qm9", "sequences": ["C" * 500]})
    assert long.status_code == 422 and long.json()["detail"][0]["loc"] == ["body", "sequences", 0]
    mismatch = httpx.post(server + "/score", json={"model": "qm9", "sequences": ["CCO"], "template": "N[MASK]"})
    assert mismatch.status_code == 422 and "template" in mismatch.json()["detail"][0]["msg"]
    ignored = httpx.post(server + "/score", json=dict(body, template="CC[MASK]"))  # was silently ignored
    assert ignored.status_code == 422 and ignored.json()["detail"][0]["loc"] == ["body", "template"]


def test_elbo_is_the_whole_bound_per_real_token_where_the_family_pads(server, checkpoints):
    """The review: the figure over real tokens only is not a bound (padding is generated too). For a SMILES
    family /score returns the NELBO over every position, padding included, per real token (the library's
    ``elbo(..., all_terms=True)``), not the all-positions average (divided by the padded length) and not
    the real tokens' terms alone; for a text family of packed blocks (no padding), the real tokens' terms."""
    body = {"model": "qm9", "decomposition": "none", "sequences": ["CC(=O)O"], "mode": "elbo", "num_mc": 64,
            "seed": 0}
    got = httpx.post(server + "/score", json=body, timeout=60).json()["scores"][0]
    model, tok, _ = load_for_inference(checkpoints / "qm9-base", "cpu", "fp32")
    x0 = torch.tensor([tok.encode("CC(=O)O")])
    real = torch.arange(tok.length)[None] < 7
    with model.compute_context():
        whole, _ = elbo(model, x0, 256, torch.Generator().manual_seed(1), real=real, all_terms=True)
        real_only, _ = elbo(model, x0, 256, torch.Generator().manual_seed(1), real=real, all_terms=False)
    assert got["real_tokens"] == 7 and got["tokens"] == tok.length and got["nelbo_terms"] == "all"
    assert abs(got["nelbo_per_token"] - whole.item()) < 0.35 * whole.item()
    assert abs(got["nelbo_per_token"] - whole.item()) < abs(got["nelbo_per_token"] - real_only.item())
    text = httpx.post(server + "/score", json={"model": "text", "sequences": ["the cat"], "mode": "elbo",
                                               "num_mc": 4, "seed": 0}, timeout=60).json()["scores"][0]
    assert text["nelbo_terms"] == "real" and text["nelbo_per_token"] > 0
