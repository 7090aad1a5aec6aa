"""A new format and a new sampler are each one definition: this file alone defines a toy format (a CP whose
mixture weights are uniform, no weight head) and a toy sampler (right-to-left unmasking, drawn jointly),
registers them, and runs them through the loss, generation and a real HTTP server, editing no other file."""

import json
import threading
import time

import httpx
import pytest
import torch
import uvicorn
from servers import SAMPLE, free_port

from ttcore.data import SmilesDataset
from ttcore.decompositions import DECOMPOSITIONS, CPOutputs
from ttcore.decompositions.factorized import draw_from_components
from ttcore.distributions import sample_categorical, softmax64
from ttcore.losses import mdlm_loss
from ttcore.models import DiTConfig, JointModel, ModelConfig, save_checkpoint
from ttcore.sampling import SamplerConfig, generate, predetermined_step
from ttcore.sampling.steps import SAMPLERS, register_step


class UniformCP:
    """CP with uniform weights: r factors per masked position, w_a = 1 / r."""
    name, preference = "ucp", -1
    joint_head, contractions, chain_rule_bytes = True, ("head",), 4

    @staticmethod
    def sums_exactly(contraction, temperature, joint, adaptive):
        return False

    @staticmethod
    def exact_contraction_bytes(cfg):
        return 0

    @staticmethod
    def outputs_per_position(rank):
        return rank

    @staticmethod
    def extra_heads(hidden_dim, rank):
        return {}

    @staticmethod
    def head_outputs(model, h, mask):
        factors = model.head.component_logits(h[mask], model.output_layer.linear).float()
        return CPOutputs(mask, factors, factors.new_zeros(h.shape[0], model.cfg.rank))

    @staticmethod
    def predetermined_step(model, h, x, masked, chosen, temperature, generator, contraction):
        uniform = torch.full((x.shape[0], model.cfg.rank), 1.0 / model.cfg.rank, dtype=torch.float64, device=x.device)
        return draw_from_components(model, h, x, chosen, sample_categorical(uniform, generator), temperature, generator)

    @staticmethod
    def component_weights(model, h, masked, temperature):
        return torch.full((int(masked.sum()), model.cfg.rank), 1.0 / model.cfg.rank, dtype=torch.float64)

    @staticmethod
    def chosen_marginals(model, h, masked, chosen, temperature, contraction):
        start = torch.zeros(int(chosen.sum()), dtype=torch.long, device=h.device)
        return softmax64(model.select_logits(h[chosen], start, model.cfg.rank), temperature).mean(1)


class RightToLeft:
    """Each step unmasks the rightmost masked positions (as many as the schedule says), drawn jointly."""
    adaptive, batchable = False, False

    def __init__(self, config):
        self.config = config

    @classmethod
    def accepts(cls, config):
        return False  # only by name

    def draw(self, run, h, tokens, masked, chosen, counts):
        rank = torch.cumsum(masked.flip(1).long(), 1).flip(1)  # 1 at the rightmost masked position
        mine = masked & (rank <= counts[:, None])
        return predetermined_step(run.model, h, tokens, masked, mine, self.config.temperature, run.generator)


@pytest.fixture
def registered():
    DECOMPOSITIONS["ucp"] = UniformCP
    register_step("right_to_left", RightToLeft)
    yield
    DECOMPOSITIONS.pop("ucp")
    SAMPLERS.pop("right_to_left")


def _toy_model(tok):
    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig.for_tokenizer(tok, hidden_dim=32, cond_dim=16, n_blocks=1, n_heads=2)))
    return JointModel.from_base(base, "ucp", 3, "1layer", noise=0.5, generator=torch.Generator().manual_seed(1))


def test_a_toy_format_and_sampler_defined_here_train_generate_and_serve(registered, tmp_path):
    ds = SmilesDataset.from_file(SAMPLE)
    tok = ds.tokenizer
    model = _toy_model(tok)
    x0 = torch.from_numpy(ds.train_tokens[:16])
    losses = mdlm_loss(model.train(), x0, tok.mask_id, generator=torch.Generator().manual_seed(0))
    losses["loss"].backward()  # the loss flows into the toy format's head
    assert torch.isfinite(losses["loss"]) and model.head.proj.weight.grad.abs().sum() > 0
    model.eval()
    states = list(generate(model, 4, 6, seed=0, sampler="right_to_left"))
    assert states[-1].done and (states[-1].tokens != tok.mask_id).all()
    for state in states:  # right to left: every step's unmasked positions lie right of what is still masked
        masked = state.tokens == tok.mask_id
        for row in range(4):
            done = state.committed[row].nonzero().flatten()
            if masked[row].any() and len(done):
                assert int(done.min()) > int(masked[row].nonzero().max())
    assert SamplerConfig(sampler="right_to_left").step_kind(model.cfg) == (False, False)

    save_checkpoint(tmp_path / "toy" / "qm9-ucp-r3", model, tok)
    from service.app import create_app
    from service.config import ServiceArgs
    from service.serving import build_serving

    args = ServiceArgs(checkpoints=str(tmp_path / "toy"), precision="fp32", threads=1)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(build_serving(args)), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        models = httpx.get(url + "/models").json()["models"]
        assert [(m["decomposition"], m["rank"]) for m in models] == [("ucp", 3)]
        body = {"model": "qm9", "decomposition": "ucp", "num_samples": 2, "steps": 4, "seed": 0,
                "sampler": "right_to_left", "stream": True}
        events = []
        with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        assert len(events) == 5 and len(events[-1]["samples"]) == 2  # 4 steps, then the answer
        first = events[0]["committed"][0]  # the first step's positions are the rightmost of the sequence
        assert sorted(first) == list(range(tok.length - len(first), tok.length))
        v1 = httpx.post(url + "/v1/completions", json={"model": "qm9-ucp-r3", "prompt": "C", "n": 2, "steps": 3,
                                                        "sampler": "right_to_left"}, timeout=60)
        assert v1.status_code == 200 and len(v1.json()["choices"]) == 2
        unknown = httpx.post(url + "/generate", json={"model": "qm9", "sampler": "nonexistent"})
        assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "sampler"]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
