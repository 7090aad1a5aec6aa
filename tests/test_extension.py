"""A new format, a new sampler, a new model kind, a new grammar, a new metrics kind and a new distillation objective
are each one definition:
this file alone defines a toy format (a CP whose mixture weights are uniform, no weight head: neither CP- nor
TT-shaped to the automaton), a toy sampler (right-to-left unmasking, drawn jointly, with a setting of its own and
the cost it declares for it), a toy model kind (one-shot models: trained fully masked by the kind's own objective,
generated in one step, answered only when named), a toy grammar, a toy metrics kind (a sample is valid when its
length is even) and a toy distillation objective (half the joint one, named by ``distill.py --objective``),
registers them through their register functions, and runs them through the loss, a data section, the recipes'
training loop and distillation recipe, generation, admission and a real HTTP server, editing no other file."""

import json
import math
import runpy
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
import torch
import uvicorn
from _loop import fit
from servers import ROOT, SAMPLE, free_port

from ttcore.constraints import Grammar, TokenDFA, register_grammar, unregister_grammar
from ttcore.data import DataSection, SmilesDataset
from ttcore.decompositions import (
    ComponentHead,
    CPOutputs,
    SumsNothing,
    draw_from_components,
    register_decomposition,
    unregister_decomposition,
)
from ttcore.distill import Objective, joint_objective, register_objective, unregister_objective
from ttcore.distributions import Site, sample_categorical, softmax64, uniforms
from ttcore.errors import InvalidSampler
from ttcore.kinds import Diffusion, register_kind, unregister_kind
from ttcore.losses import mdlm_loss
from ttcore.metrics.kinds import MetricsKind, register_metrics_kind, unregister_metrics_kind
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.recipes import TrainConfig
from ttcore.sampling import SamplerConfig, generate, predetermined_step
from ttcore.sampling.cost import Work, work_of
from ttcore.sampling.steps import ConfiguredStep, StepSettings, WorkKind, register_step, setting, unregister_step


class UniformCP(SumsNothing):
    """CP with uniform weights: r factors per masked position, w_a = 1 / r; its head is r outputs, no weight head.
    It does not offer its joint as a chain (``chains``), so a constrained request must be refused by asking the
    format (its joint object has ``chain()``: code that sniffed it would accept)."""
    name, joint_head, joint_dtype, chains = "ucp", True, torch.float32, False

    def outputs_per_position(self, rank):
        return rank

    def build_head(self, rank, kind, hidden_dim, out_vocab, base):
        return ComponentHead(rank, rank, kind, hidden_dim, out_vocab, base)

    def outputs(self, head, h, mask):
        factors = head.component_logits(h[mask]).float()
        return CPOutputs(mask, factors, factors.new_zeros(h.shape[0], head.rank))

    def _uniform(self, head, n, device):
        return torch.full((n, head.rank), 1.0 / head.rank, dtype=torch.float64, device=device)

    def draw(self, head, h, x, masked, chosen, temperature, generator, contraction):
        b, l = x.shape  # as CP: lanes 0..l-1 of the streams (or a Generator) for the positions, l for the component
        u = uniforms(generator, b, l + 1, x.device, Site.draw)
        component = sample_categorical(self._uniform(head, b, x.device), u=u[:, l])
        return draw_from_components(head, h, x, chosen, component, temperature, generator, u)

    def component_weights(self, head, h, masked, temperature):
        return self._uniform(head, int(masked.sum()), h.device)

    def marginals_at(self, head, h, masked, chosen, temperature, contraction):
        return softmax64(head.component_logits(h[chosen]), temperature).mean(1)


DRAWS = []  # each toy step's candidates, as its draw counted them


@dataclass(frozen=True)
class RightToLeftSettings(StepSettings):
    rtl_draws: int = setting(1, "`sampler: right_to_left`: candidates drawn a step (the first is kept)", ge=1, le=4)


class RightToLeft(ConfiguredStep):
    """Each step unmasks the rightmost masked positions (as many as the schedule says), drawn jointly by the
    model's format; its whole rule is here: the schedule's counts (``ConfiguredStep``), its own choice, its own
    setting (``rtl_draws`` candidates a step) and what that costs (``work_scale``)."""

    Settings = RightToLeftSettings

    def work_scale(self, model_cfg):
        return float(self.settings.rtl_draws)

    @classmethod
    def accepts(cls, config):
        return False  # only by name

    def plan(self, run):
        return None

    def choose(self, rows, h, tokens, masked, counts):
        rank = torch.cumsum(masked.flip(1).long(), 1).flip(1)  # 1 at the rightmost masked position
        return masked & (rank <= counts[:, None])

    def draw(self, rows, h, tokens, masked, chosen, counts):
        drawn = [predetermined_step(rows.model, h, tokens, masked, chosen, rows.temperature, rows.streams)
                 for _ in range(self.settings.rtl_draws)]
        DRAWS.append(len(drawn))
        return drawn[0]


OBJECTIVE_STEPS = []  # the optimizer steps the toy kind's objective ran


class OneShot(Diffusion):
    """The toy model kind: models whose config's extra says ``one_shot``, trained with every position masked
    (t = 1, its own objective), generating in one step (the default, and the only count it takes), and answered
    only when a request names them (``by_default`` false) under an id of their own."""
    name = "one_shot"
    description = "a one-shot model"
    by_default = False

    def matches(self, cfg) -> bool:
        return bool(cfg.extra.get("one_shot"))

    def model_id(self, family: str, cfg) -> str:
        return f"{family}-oneshot-r{cfg.rank}"

    def default_steps(self, cfg) -> int:
        return 1

    def check_run(self, config, steps, tokens, mask_id, constrained):
        super().check_run(config, steps, tokens, mask_id, constrained)
        if steps != 1:
            raise InvalidSampler("steps", f"a one-shot model takes steps 1, got {steps}")

    def objective(self, cfg, mask_id: int, eps: float):
        def loss(model, x0, generator=None, step: int = 0) -> dict:
            OBJECTIVE_STEPS.append(step)
            every = torch.ones_like(x0, dtype=torch.bool)
            return mdlm_loss(model, x0, mask_id, generator=generator, t=torch.ones(len(x0)), mask=every)
        return loss


def _even_length(text):
    return {} if len(text) % 2 == 0 else None  # valid: no extra answer fields


EVEN = MetricsKind("even", "a sample is valid when its length is even", tokenizers=("smiles", "char"),
                   check=lambda: _even_length)


HALF_CALLS = []  # the batches the toy objective's loss ran on


def half_objective(student, completion) -> dict:
    """The toy distillation objective: half the joint one (the student's exact likelihood of the teacher's
    completions), on the same completions."""
    HALF_CALLS.append(len(completion.x_t))
    out = joint_objective(student, completion)
    return dict(out, loss=out["loss"] / 2)


def carbons_dfa(pieces, pad_id):
    """The toy grammar: one or more carbon atoms (the piece ``C``), then the model's padding."""
    delta = torch.full((2, len(pieces)), -1, dtype=torch.long)
    delta[:, pieces.index("C")] = 1
    return TokenDFA.of_tokens(delta, torch.tensor([False, True])).finish(pad_id)


@pytest.fixture
def registered():
    register_decomposition(UniformCP())
    register_step("right_to_left", RightToLeft)
    register_metrics_kind(EVEN)
    register_grammar("carbons", Grammar(carbons_dfa, ("smiles",)))
    register_kind(OneShot())
    register_objective(Objective("half", half_objective, grows=False))
    yield
    unregister_objective("half")
    unregister_kind("one_shot")
    unregister_decomposition("ucp")
    unregister_step("right_to_left")
    unregister_metrics_kind("even")
    unregister_grammar("carbons")


def _toy_model(tok, decomposition="ucp"):
    torch.manual_seed(0)
    base = JointModel(ModelConfig(DiTConfig.for_tokenizer(tok, hidden_dim=32, cond_dim=16, n_blocks=1, n_heads=2)))
    return JointModel.from_base(base, decomposition, 3, "1layer", noise=0.5,
                                generator=torch.Generator().manual_seed(1))


def test_a_toy_samplers_setting_is_checked_read_by_its_step_priced_and_leaves_with_it(registered):
    """The toy sampler's one setting, declared in its file alone: checked by its declared bounds, read by its
    step, priced by the cost it declares, and gone once the sampler is unregistered."""
    model = _toy_model(SmilesDataset.from_file(SAMPLE).tokenizer).eval()
    config = SamplerConfig(sampler="right_to_left", rtl_draws=3)
    assert config.step.settings.rtl_draws == 3 and work_of(model.cfg, config, 6) == Work("predetermined_step", 3.0)
    assert work_of(model.cfg, SamplerConfig(sampler="right_to_left"), 6).scale == 1.0
    with pytest.raises(InvalidSampler, match=r"rtl_draws must lie in \[1, 4\], got 5"):
        SamplerConfig(sampler="right_to_left", rtl_draws=5)
    DRAWS.clear()
    list(generate(model, 2, 3, seed=0, sampler="right_to_left", rtl_draws=2))
    assert DRAWS == [2, 2, 2]
    unregister_step("right_to_left")
    with pytest.raises(TypeError, match="no step class declares: rtl_draws"):
        SamplerConfig(rtl_draws=2)
    register_step("right_to_left", RightToLeft)  # as the fixture left it


@pytest.mark.slow  # a real uvicorn server
def test_a_toy_format_and_sampler_defined_here_train_generate_and_serve(registered, tmp_path, monkeypatch):
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
    assert SamplerConfig(sampler="right_to_left").work_kind(model.cfg) is WorkKind.predetermined_step

    section = DataSection(source=str(SAMPLE), metrics="even")  # the data section accepts the kind by its name
    with pytest.raises(ValueError, match="data.metrics: even needs data.tokenizer: smiles or char"):
        DataSection(source=str(SAMPLE), tokenizer="bpe", metrics="even")
    model.cfg.extra.update(section.model_extra())
    # the recipes' own loop: two optimizer steps of the toy format, validated, checkpointed with its card
    cfg = TrainConfig(data=section, batch_size=8, val_batches=1, threads=1, device="cpu", warmup_steps=1)
    meta = fit(model, tok, torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens), cfg,
               tmp_path / "toy" / "qm9-ucp-r3", max_steps=2, quiet=True)
    assert meta["step"] == 2 and math.isfinite(meta["val"]["nll"])
    assert "decomposition: ucp, rank 3" in (tmp_path / "toy" / "qm9-ucp-r3" / "model_card.md").read_text()
    cp = _toy_model(tok, "cp")  # a CP beside it: a chain joint, which the toy grammar restricts
    cp.cfg.extra.update(section.model_extra())
    fit(cp, tok, torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens), cfg,
        tmp_path / "toy" / "qm9-cp-r3", max_steps=1, quiet=True)
    HALF_CALLS.clear()  # the toy objective through the distillation recipe, by the name it was registered under
    recipe = ROOT / "training" / "distill.py"
    monkeypatch.setattr(sys, "argv", [
        str(recipe), "--config", "qm9_distill", "--teacher", str(tmp_path / "toy" / "qm9-cp-r3"), "--data", str(SAMPLE),
        "--steps", "2", "--k", "2", "--objective", "half", "--out", str(tmp_path / "toy" / "qm9-cp-r3-half"),
        "--max-steps", "2", "--quiet", "--set", "batch_size=8", "precision=fp32", "val_batches=1", "threads=1",
        "total_steps=2"])
    runpy.run_path(str(recipe), run_name="__main__")
    assert len(HALF_CALLS) >= 2  # its loss trained the student (each optimizer step at least one batch)
    shot = _toy_model(tok, "cp")  # the toy kind: the loop trains it with the kind's objective
    shot.cfg.extra.update(section.model_extra(), one_shot=True)
    assert shot.cfg.kind.name == "one_shot"
    OBJECTIVE_STEPS.clear()
    fit(shot, tok, torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens), cfg,
        tmp_path / "toy" / "qm9-oneshot-r3", max_steps=2, quiet=True)
    assert OBJECTIVE_STEPS == [0, 1]
    assert (list(generate(shot.eval(), 2, 1, seed=0))[-1].tokens != tok.mask_id).all()
    with pytest.raises(InvalidSampler, match="takes steps 1, got 3"):
        list(generate(shot, 2, 3, seed=0))
    language = carbons_dfa(tok.pieces(range(tok.vocab_size)), tok.pad_id)
    runs = list(generate(cp.eval(), 4, 4, seed=0, constraint=language))
    assert all(set(tok.decode(row)) == {"C"} for row in runs[-1].tokens.tolist())  # the library draws within it
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
        listed = {m["checkpoint"]: m for m in httpx.get(url + "/models").json()["models"]}
        assert (listed["qm9-oneshot-r3"]["kind"], listed["qm9-oneshot-r3"]["default_steps"]) == ("one_shot", 1)
        assert listed["qm9-cp-r3-half"]["distilled"]["objective"] == "half"  # the student says how it was made
        r = httpx.post(url + "/generate", json={"model": "qm9_sample", "checkpoint": "qm9-cp-r3-half", "seed": 0,
                                                "num_samples": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["steps"] == 2, r.text  # admitted at the steps it was distilled for
        models = {m["decomposition"]: m for name, m in listed.items()
                  if name not in ("qm9-oneshot-r3", "qm9-cp-r3-half")}
        assert sorted((m["decomposition"], m["rank"]) for m in models.values()) == [("cp", 3), ("ucp", 3)]
        assert (models["ucp"]["metrics"], models["ucp"]["validates"], models["ucp"]["depicts"]) == ("even", True,
                                                                                                   False)
        assert "carbons" in models["cp"]["grammars"]  # the toy grammar, offered for the tokenizer's kind
        carbons = dict(model="qm9_sample", num_samples=3, steps=4, seed=0, grammar="carbons")
        r = httpx.post(url + "/generate", json=dict(carbons, decomposition="cp"), timeout=60)
        assert r.status_code == 200 and all(set(x["text"]) == {"C"} for x in r.json()["samples"]), r.text
        r = httpx.post(url + "/generate", json=dict(carbons, decomposition="ucp"), timeout=60)  # the format says no
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "grammar"], r.text
        assert "not a chain" in r.json()["detail"][0]["msg"]
        valid = httpx.post(url + "/generate", json={"model": "qm9_sample", "decomposition": "ucp", "num_samples": 3,
                                                    "steps": 4, "seed": 1, "valid_only": True}, timeout=60)
        assert valid.status_code == 200, valid.text
        samples = valid.json()["samples"]  # drawn in further rounds until three pass the kind's check
        assert len(samples) == 3 and all(s["valid"] and len(s["text"]) % 2 == 0 for s in samples)
        body = {"model": "qm9_sample", "decomposition": "ucp", "num_samples": 2, "steps": 4, "seed": 0,
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
        props = httpx.get(url + "/openapi.json").json()["components"]["schemas"]["GenerateRequest"]["properties"]
        assert props["rtl_draws"]["maximum"] == 4 and "candidates drawn" in props["rtl_draws"]["description"]
        DRAWS.clear()
        r = httpx.post(url + "/generate", json=dict(body, stream=False, rtl_draws=2), timeout=60)
        assert r.status_code == 200 and DRAWS == [2] * 4, (r.text, DRAWS)  # the request's setting reached the step
        r = httpx.post(url + "/generate", json=dict(body, stream=False, rtl_draws=5), timeout=60)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rtl_draws"], r.text
        v1 = httpx.post(url + "/v1/completions", json={"model": "qm9_sample-ucp-r3", "prompt": "C", "n": 2, "steps": 3,
                                                        "sampler": "right_to_left"}, timeout=60)
        assert v1.status_code == 200 and len(v1.json()["choices"]) == 2
        shot = {"model": "qm9_sample", "checkpoint": "qm9-oneshot-r3", "num_samples": 2, "seed": 0}
        r = httpx.post(url + "/generate", json=shot, timeout=60)  # admitted at its kind's default steps
        assert r.status_code == 200 and r.json()["steps"] == 1 and r.json()["checkpoint"] == "qm9-oneshot-r3", r.text
        assert all("[MASK]" not in s["text"] for s in r.json()["samples"])
        r = httpx.post(url + "/generate", json=dict(shot, steps=3), timeout=60)  # the kind's rule, as a 422
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "steps"], r.text
        assert "takes steps 1" in r.json()["detail"][0]["msg"]
        r = httpx.post(url + "/generate", json={"model": "qm9_sample", "decomposition": "cp", "steps": 3}, timeout=60)
        assert r.status_code == 200 and r.json()["checkpoint"] == "qm9-cp-r3", r.text  # not answered unless named
        ids = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
        assert "qm9_sample-oneshot-r3" in ids, ids
        v1 = httpx.post(url + "/v1/completions", json={"model": "qm9_sample-oneshot-r3", "prompt": "[MASK]" * 4,
                                                        "n": 2}, timeout=60)
        assert v1.status_code == 200 and v1.json()["ttcore"]["steps"] == 1, v1.text
        unknown = httpx.post(url + "/generate", json={"model": "qm9_sample", "sampler": "nonexistent"})
        assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "sampler"]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
