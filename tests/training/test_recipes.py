"""The recipes on the committed QM9 sample: the loss drops; a killed run resumes to the same state."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _loop import fit
from safetensors.torch import load_file
from servers import spawn, stderr_tail

from ttcore.data import SmilesDataset
from ttcore.data.qm9 import default_cache_dir
from ttcore.models import DiTConfig, JointModel, ModelConfig, load_checkpoint, read_train_config
from ttcore.recipes import TrainConfig, evaluate_loss, load_config

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "qm9_sample.txt"
TINY = ROOT / "training" / "configs" / "tiny.yaml"


pytestmark = pytest.mark.slow  # servers, Ray, training or end-to-end commands


def _run(*args, **kw):
    return spawn([sys.executable, *args], cwd=ROOT, **kw)


def _sample_model(**dims):
    """The committed QM9 sample as tensors, its tokenizer, and a fresh (seeded) base model of ``dims``."""
    ds = SmilesDataset.from_file(SAMPLE)
    tok = ds.tokenizer
    torch.manual_seed(0)
    model = JointModel(ModelConfig(DiTConfig.for_tokenizer(tok, **dims)))
    return model, tok, torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens)


def test_tiny_model_loss_drops(tmp_path):
    cfg = load_config(TINY, ["threads=1"])
    model, tok, train, val = _sample_model(**{k: getattr(cfg.model, k) for k in cfg.model.BACKBONE})
    before = evaluate_loss(model, val, tok.mask_id, batch_size=cfg.batch_size, batches=cfg.val_batches,
                           precision=cfg.precision, eps=cfg.eps, device=torch.device("cpu"))["nll"]
    meta = fit(model, tok, train, val, cfg, tmp_path / "ck", max_steps=80, quiet=True)
    assert meta["val"]["nll"] < before - 0.8, (before, meta["val"])
    loaded, _, _ = load_checkpoint(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / "train_state" / "state.json").read_text())["step"] == 80
    speed = meta["throughput"]  # tokens/s and MFU (ttcore.flops), in the state and on the card
    assert speed["tokens_per_second"] > 0 and 0 < speed["mfu"] <= 1 and speed["peak"].startswith("measured cpu")
    assert speed["mfu"] == pytest.approx(speed["tokens_per_second"] * speed["flops_per_token"] / speed["peak_flops"])
    assert "- throughput: " in (tmp_path / "ck" / "model_card.md").read_text()


def test_a_run_at_precision_auto_trains_in_what_its_device_runs_natively_and_records_it(tmp_path):
    """precision auto (the default and the configs' value): bf16 where the CPU has AVX512-BF16 / AMX, fp32
    elsewhere; the saved config and the card name the precision the run trained in, never auto."""
    from ttcore.models import resolve_precision

    cfg = load_config(TINY, ["threads=1", "precision=auto", "val_every=1000"])
    model, tok, train, val = _sample_model(**{k: getattr(cfg.model, k) for k in cfg.model.BACKBONE})
    fit(model, tok, train, val, cfg, tmp_path / "ck", max_steps=2, quiet=True)
    saved = json.loads((tmp_path / "ck" / "train_state" / "state.json").read_text())["config"]["precision"]
    assert saved == resolve_precision("auto", "cpu") in ("bf16", "fp32")
    assert f'"precision": "{saved}"' in (tmp_path / "ck" / "model_card.md").read_text()
    assert TrainConfig().precision == "auto"
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, got 'fp16'"):
        load_config(TINY, ["precision=fp16"])


def test_a_run_stopped_by_its_wall_clock_says_so(tmp_path):
    """The review: "equal budget" fine-tunes bounded by --max-minutes got 177 and 95 steps on a shared machine.
    The budget is steps; a run the wall clock (a safety stop) ends early records it in its state and card."""
    cfg = load_config(TINY, ["threads=1"])
    model, tok, train, val = _sample_model(**{k: getattr(cfg.model, k) for k in cfg.model.BACKBONE})
    meta = fit(model, tok, train, val, cfg, tmp_path / "ck", max_steps=50, max_minutes=1e-9, quiet=True)
    state = json.loads((tmp_path / "ck" / "train_state" / "state.json").read_text())
    assert meta["step"] < 50 and state["stopped_early"] == {"step": meta["step"], "of": 50, "by": "max_minutes"}
    card = (tmp_path / "ck" / "model_card.md").read_text()
    assert f"stopped early: at step {meta['step']} of the 50 asked, by the wall-clock safety stop" in card
    again = fit(model, tok, train, val, cfg, tmp_path / "ck", resume=True, max_steps=4, quiet=True)
    state = json.loads((tmp_path / "ck" / "train_state" / "state.json").read_text())
    assert again["step"] == 4 and "stopped_early" not in state  # a run that reaches its steps says nothing


def _step(out: Path) -> int:
    try:
        return json.loads((out / "train_state" / "state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return -1


def test_kill_and_resume_reaches_the_same_state(tmp_path):
    common = ["--config", "tiny", "--data", SAMPLE, "--max-steps", 120, "--quiet",
              "--set", "threads=1", "ckpt_minutes=0", "val_every=40"]
    straight = _run(ROOT / "training" / "pretrain.py", "--out", tmp_path / "a", *common)
    assert straight.wait(timeout=300) == 0, stderr_tail(straight)
    killed = _run(ROOT / "training" / "pretrain.py", "--out", tmp_path / "b", *common)
    deadline = time.time() + 120
    while _step(tmp_path / "b") < 30 and time.time() < deadline and killed.poll() is None:
        time.sleep(0.01)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    stopped_at = _step(tmp_path / "b")
    assert 0 < stopped_at < 120, stopped_at
    resumed = _run(ROOT / "training" / "pretrain.py", "--out", tmp_path / "b", "--resume", *common)
    assert resumed.wait(timeout=300) == 0, stderr_tail(resumed)
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa = load_file(str(tmp_path / "a" / "train_state" / "state.safetensors"))
    sb = load_file(str(tmp_path / "b" / "train_state" / "state.safetensors"))
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_finetune_recipe_from_base(tmp_path):
    base = _run(ROOT / "training" / "pretrain.py", "--config", "tiny", "--data", SAMPLE, "--out", tmp_path / "base",
                "--max-steps", 20, "--quiet", "--set", "model.n_blocks=1")  # not the tiny config's 2 blocks
    assert base.wait(timeout=300) == 0, stderr_tail(base)
    for dec, rank, head in (("tt", 3, "2layer"), ("cp", 4, "1layer"), ("none", 1, "1layer")):
        ft = _run(ROOT / "training" / "finetune.py", "--config", "tiny", "--data", SAMPLE, "--base", tmp_path / "base",
                  "--decomposition", dec, "--rank", rank, "--head", head, "--out", tmp_path / dec,
                  "--max-steps", 10, "--quiet")
        assert ft.wait(timeout=300) == 0, stderr_tail(ft)
        model, _, config = load_checkpoint(tmp_path / dec)
        assert (config["model"]["decomposition"], config["model"]["rank"]) == (dec, rank)
        # the recorded config and the card name the base's architecture, not the config file's defaults
        assert model.cfg.dit.n_blocks == read_train_config(tmp_path / dec)["model"]["n_blocks"] == 1
        assert '"n_blocks": 1' in (tmp_path / dec / "model_card.md").read_text()
    # a joint checkpoint as --base continues from its own weights, head included (lr 0: unchanged)
    more = _run(ROOT / "training" / "finetune.py", "--config", "tiny", "--data", SAMPLE, "--base", tmp_path / "tt",
                "--decomposition", "tt", "--rank", 3, "--head", "2layer", "--out", tmp_path / "more",
                "--max-steps", 2, "--quiet", "--set", "lr=0", "marginal_weight=1.0")
    assert more.wait(timeout=300) == 0, stderr_tail(more)
    a, b = (load_file(str(tmp_path / run / "model.safetensors")) for run in ("tt", "more"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert load_checkpoint(tmp_path / "more")[2]["model"]["extra"]["continued_from"] == "tt"
    # a multiple of its rank grows it first (JointModel.with_rank): the backbone as it was, rank 6
    grown = _run(ROOT / "training" / "finetune.py", "--config", "tiny", "--data", SAMPLE, "--base", tmp_path / "tt",
                 "--decomposition", "tt", "--rank", 6, "--head", "2layer", "--out", tmp_path / "grown",
                 "--max-steps", 1, "--quiet", "--set", "lr=0")
    assert grown.wait(timeout=300) == 0, stderr_tail(grown)
    g = load_file(str(tmp_path / "grown" / "model.safetensors"))
    assert load_checkpoint(tmp_path / "grown")[2]["model"]["rank"] == 6
    assert g["head.mix.weight"].shape[0] == 4 * a["head.mix.weight"].shape[0]  # r * r outputs: 36 of 9
    assert all(torch.equal(a[k], g[k]) for k in a if k.startswith("backbone."))
    wrong = _run(ROOT / "training" / "finetune.py", "--config", "tiny", "--data", SAMPLE, "--base", tmp_path / "tt",
                 "--decomposition", "tt", "--rank", 4, "--head", "2layer", "--out", tmp_path / "wrong",
                 "--max-steps", 1)
    assert wrong.wait(timeout=300) != 0 and "--rank 3 (or a multiple)" in stderr_tail(wrong)


def test_text_recipes_and_prefix_generation(tmp_path):
    """A tiny text MDM on the public-domain corpus, its TT fine-tune, and prefix-prompted generation."""
    small = ["--set", "data=text", "family=text", "bpe_vocab=512", "length=32", "threads=1"]
    base = _run(ROOT / "training" / "pretrain.py", "--config", "tiny", "--out", tmp_path / "base", "--max-steps", 10,
                "--quiet", *small)
    assert base.wait(timeout=600) == 0, stderr_tail(base)
    ft = _run(ROOT / "training" / "finetune.py", "--config", "tiny", "--base", tmp_path / "base", "--decomposition",
              "tt", "--rank", 2, "--head", "2layer", "--out", tmp_path / "tt", "--max-steps", 5, "--quiet", *small)
    assert ft.wait(timeout=600) == 0, stderr_tail(ft)
    model, tok, config = load_checkpoint(tmp_path / "tt")
    assert tok.kind == "text" and config["model"]["extra"]["family"] == "text" and model.cfg.head == "2layer"
    from ttcore.sampling import generate
    prefix = tok.tokenize("The state of the Union")
    prompt = torch.tensor(prefix + [tok.mask_id] * (tok.length - len(prefix)))
    *_, last = generate(model, 3, 4, prompt=prompt, seed=0)
    assert (last.tokens[:, : len(prefix)] == torch.tensor(prefix)).all() and (last.tokens != tok.mask_id).all()
    assert all(tok.decode(row).startswith("The state of the Union") for row in last.tokens.tolist())
    again = _run(ROOT / "training" / "pretrain.py", "--config", "tiny", "--tokenizer", tmp_path / "base", "--out",
                 tmp_path / "again", "--max-steps", 2, "--quiet", *small, "bpe_vocab=300")
    assert again.wait(timeout=600) == 0, stderr_tail(again)
    assert load_checkpoint(tmp_path / "again")[1].to_dict() == tok.to_dict()  # not a new 300-token BPE


def test_resume_on_another_device_type_reseeds_deterministically(tmp_path):
    """A train state saved on CUDA resumes on CPU (and back): the generator's state cannot move between
    device types, so the mask stream reseeds from (seed, step); two such resumes agree exactly."""
    cfg = load_config(TINY, ["threads=1", "device=cpu"])
    model, tok, train, val = _sample_model(hidden_dim=16, cond_dim=8, n_blocks=1, n_heads=2)
    fit(model, tok, train, val, cfg, tmp_path / "a", max_steps=6, quiet=True)
    state = tmp_path / "a" / "train_state" / "state.json"
    meta = json.loads(state.read_text())
    state.write_text(json.dumps(dict(meta, device="cuda:0")))  # as if the first 6 steps ran on a GPU
    finals = []
    for copy in ("b", "c"):
        subprocess.run(["cp", "-r", str(tmp_path / "a"), str(tmp_path / copy)], check=True)
        resumed, _, _ = load_checkpoint(tmp_path / copy)
        out = fit(resumed, tok, train, val, cfg, tmp_path / copy, resume=True, max_steps=10, quiet=True)
        assert out["step"] == 10 and out["device"] == "cpu"
        assert out["device_moves"] == [{"step": 6, "from": "cuda", "to": "cpu"}]
        finals.append(load_file(str(tmp_path / copy / "model.safetensors")))
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_finetune_recipe_from_an_mdlm_checkpoint_then_served(tmp_path):
    """The README's MDLM-OWT command on a tiny directory in MDLM's layout (config.json +
    model.safetensors, GPT-2 vocabulary): fine-tune a few steps, export, serve, generate."""
    import httpx
    from models.test_mdlm_compat import _write_mdlm
    from servers import start_uvicorn

    _write_mdlm(tmp_path / "mdlm")
    ft = _run(ROOT / "training" / "finetune.py", "--config", "text_finetune", "--base", tmp_path / "mdlm",
              "--decomposition", "tt", "--rank", 2, "--head", "2layer", "--out", tmp_path / "owt-tt-r2",
              "--max-steps", 2, "--quiet", "--set", "tokenizer=gpt2", "length=32", "batch_size=4", "val_batches=1",
              "threads=1", "precision=fp32")
    assert ft.wait(timeout=600) == 0, stderr_tail(ft)
    model, tok, config = load_checkpoint(tmp_path / "owt-tt-r2")
    assert (config["model"]["decomposition"], config["model"]["rank"], model.cfg.dit.out_vocab) == ("tt", 2, 50257)
    assert json.loads((tmp_path / "owt-tt-r2" / "train_state" / "state.json").read_text())["step"] == 2
    export = _run(ROOT / "training" / "export.py", "--src", tmp_path / "owt-tt-r2", "--out",
                  tmp_path / "served" / "owt-tt-r2", "--family", "owt")
    assert export.wait(timeout=300) == 0, stderr_tail(export)
    proc, url = start_uvicorn(tmp_path / "served")
    try:
        r = httpx.post(url + "/generate", json={"model": "owt", "num_samples": 2, "steps": 4, "seed": 0,
                                                "prompt": "The"}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["decomposition"] == "tt" and len(body["samples"]) == 2
        assert all(s["text"].startswith("The") for s in body["samples"]), body
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_run_sized_to_minutes_prints_and_trains_the_steps_that_fit(tmp_path):
    """--fit-minutes: the first steps are timed, the steps that fit are printed and become the budget (and the
    schedule's length); the run ends there."""
    out = tmp_path / "fit"
    done = subprocess.run([sys.executable, str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--data",
                           str(SAMPLE), "--out", str(out), "--fit-minutes", "0.1", "--quiet", "--set", "threads=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    line = re.search(r"fit 0.1 minutes: [\d.]+ s/step measured over 10 steps .*: (\d+) steps", done.stdout)
    fitted = int(line.group(1))
    state = json.loads((out / "train_state" / "state.json").read_text())
    assert state["step"] == fitted > 11 and state["config"]["total_steps"] == fitted  # it stopped there


def test_model_size_presets_set_the_backbone():
    from ttcore.recipes import MODEL_SIZES, TrainConfig

    cfg = TrainConfig.from_dict({"model": {"size": "m", "hidden_dim": 64}})
    assert (cfg.model.hidden_dim, cfg.model.n_blocks, cfg.model.n_heads) == (512, 8, 8)  # the size wins
    assert set(MODEL_SIZES) == {"s", "m", "l", "xl"}
    with pytest.raises(ValueError, match="model.size must be one of"):
        TrainConfig.from_dict({"model": {"size": "huge"}})


def test_configs_nest_the_model_and_export_migrates_the_flat_configs_of_earlier_checkpoints():
    from export import migrate_train_config

    cfg = load_config(TINY, ["model.rank=4", "decomposition=tt", "lr=0.01"])
    assert (cfg.model.rank, cfg.model.decomposition, cfg.model.hidden_dim, cfg.lr) == (4, "tt", 32, 0.01)
    flat = {"hidden_dim": 64, "rank": 8, "decomposition": "tt", "batch_size": 16}  # as cards recorded it
    with pytest.raises(ValueError, match=r"belong in the model: / data: sections .*training/export.py"):
        TrainConfig.from_dict(flat)
    legacy = TrainConfig.from_dict(migrate_train_config(flat))  # export.py: the one place old configs are read
    assert (legacy.model.hidden_dim, legacy.model.rank, legacy.batch_size) == (64, 8, 16)
    from dataclasses import asdict
    assert TrainConfig.from_dict(asdict(legacy)) == legacy
    try:
        load_config(TINY, ["hiden_dim=3"])
    except ValueError as e:
        assert "hiden_dim" in str(e) and "hidden_dim" in str(e)
    else:
        raise AssertionError("an unknown key must be refused")


def test_cards_record_commands_without_the_trainers_paths(tmp_path, monkeypatch):
    from ttcore.recipes import public_command
    monkeypatch.chdir(tmp_path)
    argv = ["python", str(tmp_path / "training" / "finetune.py"), "--base", "/home/someone/ck", "--out=/srv/x/run",
            "--set", "data=/data/q.txt", "lr=0.1"]
    cmd = public_command(argv)
    assert cmd == "python training/finetune.py --base .../ck --out=.../run --set data=.../q.txt lr=0.1"


def test_ema_weights_are_checkpointed_and_a_resume_is_exact(tmp_path):
    """With ema_decay the checkpoint holds the average (served, exported), the train state the optimizer's
    own weights; stopping and resuming gives bit-identical weights, average and optimizer state."""
    cfg = load_config(TINY, ["threads=1", "device=cpu", "ema_decay=0.9", "val_every=1000"])
    dims = dict(hidden_dim=16, cond_dim=8, n_blocks=1, n_heads=2)
    model, tok, train, val = _sample_model(**dims)
    fit(model, tok, train, val, cfg, tmp_path / "straight", max_steps=12, quiet=True)
    model, tok, train, val = _sample_model(**dims)
    fit(model, tok, train, val, cfg, tmp_path / "stopped", max_steps=6, quiet=True)
    resumed, _, _ = load_checkpoint(tmp_path / "stopped")
    fit(resumed, tok, train, val, cfg, tmp_path / "stopped", resume=True, max_steps=12, quiet=True)
    for name in ("model.safetensors", "train_state/state.safetensors"):
        a, b = load_file(str(tmp_path / "straight" / name)), load_file(str(tmp_path / "stopped" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    weights = load_file(str(tmp_path / "straight" / "model.safetensors"))
    state = load_file(str(tmp_path / "straight" / "train_state" / "state.safetensors"))
    raw = {k[4:]: v for k, v in state.items() if k.startswith("raw.")}
    assert raw and all(k in weights for k in raw)
    assert any(not torch.equal(weights[k], raw[k]) for k in raw)  # the average is not the last iterate
    assert "the EMA of the training weights" in (tmp_path / "straight" / "model_card.md").read_text()


def test_frozen_backbone_and_head_learning_rate(tmp_path):
    """freeze_backbone_steps: the backbone's weights do not move for those steps while the head's do; then
    head_lr_ratio=0 holds the head still while the backbone trains (AdamW without weight decay)."""
    dims = dict(hidden_dim=16, cond_dim=8, n_blocks=1, n_heads=2)

    def joint():  # a base with random weights everywhere (a fresh DiT's zero-initialized output passes no gradient)
        model, tok, train, val = _sample_model(**dims)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.2)
        return JointModel.from_base(model, "tt", 2, "1layer", 0.05, torch.Generator().manual_seed(0)), tok, train, val

    model, tok, train, val = joint()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def moved(m, prefix):
        return {n for n, p in m.named_parameters() if n.startswith(prefix) and not torch.equal(p, before[n])}

    cfg = load_config(TINY, ["threads=1", "device=cpu", "val_every=1000", "freeze_backbone_steps=5"])
    fit(model, tok, train, val, cfg, tmp_path / "frozen", max_steps=5, quiet=True)
    assert not moved(model, "backbone.") and moved(model, "head.")
    model, tok, train, val = joint()
    cfg = load_config(TINY, ["threads=1", "device=cpu", "val_every=1000", "head_lr_ratio=0"])
    fit(model, tok, train, val, cfg, tmp_path / "still", max_steps=5, quiet=True)
    assert moved(model, "backbone.") and not moved(model, "head.") and not moved(model, "output_layer.")


def test_a_tiny_vadd_pretrains_fine_tunes_to_tt_exports_and_serves(tmp_path):
    """pretrain.py --latent vadd, finetune.py --decomposition tt on it (Eq. 21 with the TT joint), export,
    then the server: /models says base vadd, /generate is seeded and reproducible, /score refuses it."""
    import httpx
    from servers import start_uvicorn

    common = ["--config", "tiny", "--data", SAMPLE, "--quiet", "--set", "threads=1"]
    base = _run(ROOT / "training" / "pretrain.py", "--latent", "vadd", "--latent-dim", 8, "--out", tmp_path / "base",
                "--max-steps", 30, *common)
    assert base.wait(timeout=300) == 0, stderr_tail(base)
    state = json.loads((tmp_path / "base" / "train_state" / "state.json").read_text())
    assert set(state["val"]) == {"nll", "kl", "objective"} and state["val"]["kl"] >= 0
    ft = _run(ROOT / "training" / "finetune.py", "--base", tmp_path / "base", "--decomposition", "tt", "--rank", 2,
              "--head", "1layer", "--out", tmp_path / "tt", "--max-steps", 10, *common)
    assert ft.wait(timeout=300) == 0, stderr_tail(ft)
    model, _, config = load_checkpoint(tmp_path / "tt")
    assert model.latent_dim == 8 and model.recognition is not None and config["model"]["decomposition"] == "tt"
    exported = tmp_path / "served" / "qm9-vadd-tt-r2"
    done = subprocess.run([sys.executable, str(ROOT / "training" / "export.py"), "--src", str(tmp_path / "tt"),
                           "--out", str(exported), "--family", "qm9"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # the recipe's config travels as train_config.json (cards are rendered from it, never parsed back)
    trained = json.loads((tmp_path / "tt" / "train_config.json").read_text())
    assert trained == json.loads((exported / "train_config.json").read_text()) and trained["model"]["rank"] == 2
    tt_state = json.loads((tmp_path / "tt" / "train_state" / "state.json").read_text())
    assert trained == tt_state["config"]  # the same config the resumable state holds
    proc, url = start_uvicorn(tmp_path / "served", "--threads", "1")
    try:
        (info,) = httpx.get(url + "/models").json()["models"]
        assert (info["base"], info["latent_dim"], info["decomposition"]) == ("vadd", 8, "tt")
        body = dict(num_samples=3, steps=4, seed=5)
        a, b = (httpx.post(url + "/generate", json=body, timeout=60).json() for _ in range(2))
        assert [s["text"] for s in a["samples"]] == [s["text"] for s in b["samples"]]
        r = httpx.post(url + "/score", json=dict(sequences=["CCO"]))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_gpu_lease_continuation_script_runs_at_smoke_size(tmp_path):
    """training/device_continue.sh (documented for GPU leases) at its rehearsal size on CPU: both served QM9
    fine-tunes continued 2 steps each, exported, and brought back as the split tar."""
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path / "out"), PYTHON=sys.executable, RUNS=str(tmp_path / "runs"),
               TTCORE_CACHE=str(default_cache_dir()))  # the suite's: QM9's tokenized split read once
    done = subprocess.run(["bash", str(ROOT / "training" / "device_continue.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "tt exit 0" in done.stdout and "none exit 0" in done.stdout
    parts = sorted((tmp_path / "out").glob("continued.tar.part-*"))
    assert parts and all(p.stat().st_size <= 15 << 20 for p in parts)
    for name in ("qm9-tt-r16-more", "qm9-none-r1-more"):
        assert (tmp_path / "runs" / "export" / name / "model.safetensors").is_file()


def test_the_gpu_lease_rank_script_runs_at_smoke_size(tmp_path):
    """training/device_rank.sh (the rank rows' GPU lease) at its rehearsal size on CPU: TT r=32, CP r=256 and
    a continued TT fine-tune 2 steps each side by side, exported, and brought back as the split tar."""
    env = dict(os.environ, SMOKE="1", OUT=str(tmp_path / "out"), PYTHON=sys.executable, RUNS=str(tmp_path / "runs"),
               TTCORE_CACHE=str(default_cache_dir()), BASE="checkpoints/qm9-none-r1", CONT="checkpoints/qm9-tt-r16",
               CONT_RANK="16")
    done = subprocess.run(["bash", str(ROOT / "training" / "device_rank.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for name in ("qm9-tt-r32", "qm9-cp-r256", "qm9-tt-r16-x2"):
        assert f"{name} exit 0" in done.stdout
        assert (tmp_path / "runs" / "export" / name / "model.safetensors").is_file()
    parts = sorted((tmp_path / "out").glob("rank.tar.part-*"))
    assert parts and all(p.stat().st_size <= 15 << 20 for p in parts)


@pytest.mark.parametrize("decomposition", ["none", "tt"])
def test_gradient_accumulation_and_activation_checkpointing_train_the_same_weights(tmp_path, decomposition):
    """grad_accum: the batch in micro-batches, each normalized by the whole batch's masked count, the same masks
    drawn: the weights after 4 steps match one-piece training to float rounding (the old mean of per-piece
    means would not). activation_checkpointing recomputes the blocks in backward: the same weights again."""
    dims = dict(hidden_dim=16, cond_dim=8, n_blocks=2, n_heads=2)

    def trained(name: str, *overrides: str) -> dict:
        model, tok, train, val = _sample_model(**dims)
        with torch.no_grad():  # random weights everywhere: every parameter gets a gradient
            for p in model.parameters():
                p.normal_(0, 0.2)
        if decomposition != "none":
            model = JointModel.from_base(model, decomposition, 2, "1layer", 0.05, torch.Generator().manual_seed(0))
        cfg = load_config(TINY, ["threads=1", "device=cpu", "val_every=1000", "batch_size=12", *overrides])
        fit(model, tok, train, val, cfg, tmp_path / name, max_steps=4, quiet=True)
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    one = trained("one")
    moved = max((p - q).abs().max().item() for p, q in zip(one.values(), trained("zero", "lr=0").values()))
    # float rounding: sums in another order move a weight by some ulps of its size in each of the 4 steps (CI's
    # AVX-512 CPU: 5.96e-7 at 3.0e-3 moved); the per-piece-means bug moves it by a share of `moved` itself
    ulp = torch.finfo(torch.float32).eps * max(p.abs().max().item() for p in one.values())
    for name, overrides in (("accum", ["grad_accum=3"]), ("ckpt", ["activation_checkpointing=true"]),
                            ("both", ["grad_accum=2", "activation_checkpointing=true"])):
        other = trained(name, *overrides)
        gap = max((one[n] - other[n]).abs().max().item() for n in one)
        assert gap < 1e-4 * moved + 8 * 4 * ulp, (name, gap, moved, ulp)
    with pytest.raises(ValueError, match="grad_accum must be >= 1 and divide batch_size"):
        load_config(TINY, ["batch_size=12", "grad_accum=5"])


def test_a_non_finite_loss_stops_the_run_with_a_clear_error_and_writes_nothing_after_it(tmp_path):
    """A run whose loss goes NaN (here lr = 1e30: the first update sends the logits to inf) stops at the next
    check with one clear line, exit status 1, and the checkpoint written before it is left as it was."""
    out = tmp_path / "nan"
    common = [sys.executable, str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--data", str(SAMPLE),
              "--out", str(out), "--quiet"]
    good = subprocess.run(common + ["--max-steps", "2", "--set", "threads=1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert good.returncode == 0, good.stderr[-2000:]
    before = (out / "model.safetensors").read_bytes()
    bad = subprocess.run(common + ["--max-steps", "8", "--resume", "--set", "threads=1", "lr=1e30", "warmup_steps=0",
                                   "log_every=4"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1, bad.stderr[-2000:]
    assert re.search(r"the loss was not finite \(NaN or inf\) at step [3-8]; training stopped and the last "
                     r"checkpoint .* is kept as it was", bad.stderr), bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr
    assert (out / "model.safetensors").read_bytes() == before


def test_ar_recipe_trains_resumes_exactly_and_exports(tmp_path, checkpoints):
    """training/train_ar.py at its smallest: the AR objective falls, the checkpoint is causal with the rank-1 head and
    an exact validation line; a resumed run continues to the same weights as one straight run; export keeps it;
    --base starts from a full-sequence checkpoint (its size and vocabulary) and refuses a joint one; train_blocks.py
    --base starts a block model from the AR checkpoint, at b = 1 the same model."""
    from ttcore.kinds.autoregressive import ar_log_prob
    from ttcore.sampling.blocks import block_log_prob

    common = ["--config", "tiny", "--data", SAMPLE, "--quiet", "--set", "val_every=10", "total_steps=20"]
    straight = _run(ROOT / "training" / "train_ar.py", "--out", tmp_path / "a", "--max-steps", 20, *common)
    assert straight.wait(timeout=300) == 0, stderr_tail(straight)
    half = _run(ROOT / "training" / "train_ar.py", "--out", tmp_path / "b", "--max-steps", 10, *common)
    assert half.wait(timeout=300) == 0, stderr_tail(half)
    rest = _run(ROOT / "training" / "train_ar.py", "--out", tmp_path / "b", "--max-steps", 20, "--resume", *common)
    assert rest.wait(timeout=300) == 0, stderr_tail(rest)
    model, tok, config = load_checkpoint(tmp_path / "a")
    assert config["model"]["dit"]["causal"] and model.cfg.head_label == "ar"
    card = (tmp_path / "a" / "model_card.md").read_text()
    assert re.search(r"validation: -log p\(x\) [\d.]+ nats per position \(exact", card), card
    val = torch.tensor([tok.encode(s) for s in SAMPLE.read_text().split()[:64]])
    with torch.no_grad():
        first = -ar_log_prob(JointModel(model.cfg).eval(), val).mean()
        trained = -ar_log_prob(model.eval(), val).mean()
    assert trained < first - 1.0  # nats per sequence: the objective fell
    a, b = (load_file(str(tmp_path / run / "model.safetensors")) for run in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    export = _run(ROOT / "training" / "export.py", "--src", tmp_path / "a", "--out", tmp_path / "exported")
    assert export.wait(timeout=300) == 0, stderr_tail(export)
    assert load_checkpoint(tmp_path / "exported")[0].cfg.dit.causal
    started = _run(ROOT / "training" / "train_ar.py", "--base", checkpoints / "qm9-base", "--out", tmp_path / "c",
                   "--max-steps", 2, *common)
    assert started.wait(timeout=300) == 0, stderr_tail(started)
    base, base_tok, _ = load_checkpoint(checkpoints / "qm9-base")
    ar, ar_tok, _ = load_checkpoint(tmp_path / "c")
    assert ar.cfg.dit.causal and ar.cfg.kind.name == "autoregressive" and ar_tok.vocab == base_tok.vocab
    assert ar.cfg.dit.hidden_dim == base.cfg.dit.hidden_dim and ar.cfg.dit.length == base.cfg.dit.length
    joint = _run(ROOT / "training" / "train_ar.py", "--base", checkpoints / "qm9-tt-r2", "--out", tmp_path / "d",
                 "--max-steps", 2, *common)
    assert joint.wait(timeout=300) != 0 and "an autoregressive model has a rank-1 head" in stderr_tail(joint)
    blocks = _run(ROOT / "training" / "train_blocks.py", "--base", tmp_path / "c", "--block-size", 1, "--out",
                  tmp_path / "c-b1", "--max-steps", 0, *common)  # SDAR's start: at b = 1 the same model
    assert blocks.wait(timeout=300) == 0, stderr_tail(blocks)
    b1, _, _ = load_checkpoint(tmp_path / "c-b1")
    assert b1.cfg.kind.name == "block_diffusion" and b1.cfg.dit.causal and b1.cfg.kind.base(b1.cfg) == "sdar"
    x = torch.tensor([ar_tok.encode(s) for s in SAMPLE.read_text().split()[:16]])
    with torch.no_grad():
        assert torch.allclose(block_log_prob(b1.eval(), x), ar_log_prob(ar.eval(), x).double(), atol=1e-4)


def test_block_recipe_trains_a_block_model_that_finetunes_to_tt_and_generates(tmp_path, checkpoints):
    """training/train_blocks.py at its smallest (its docstring's last command): a block-causal checkpoint whose
    validation line is its exact likelihood; finetune.py puts a TT head on each block (the kind's objective
    stays); the result generates block by block and its exact likelihood is finite; a joint head named in the
    config trains from scratch; --base starts from a full-sequence checkpoint, its length padded to whole blocks."""
    from ttcore.sampling import generate
    from ttcore.sampling.blocks import block_log_prob

    common = ["--config", "tiny", "--data", SAMPLE, "--quiet", "--max-steps", 4]
    base = _run(ROOT / "training" / "train_blocks.py", "--block-size", 2, "--out", tmp_path / "b2", *common)
    assert base.wait(timeout=300) == 0, stderr_tail(base)
    model, tok, config = load_checkpoint(tmp_path / "b2")
    assert config["model"]["dit"]["block_size"] == 2 and model.cfg.kind.name == "block_diffusion"
    assert re.search(r"validation: -log p\(x\) [\d.]+ nats per position \(exact",
                     (tmp_path / "b2" / "model_card.md").read_text())
    ft = _run(ROOT / "training" / "finetune.py", "--base", tmp_path / "b2", "--decomposition", "tt", "--rank", 2,
              "--out", tmp_path / "b2-tt", *common)
    assert ft.wait(timeout=300) == 0, stderr_tail(ft)
    tt, _, _ = load_checkpoint(tmp_path / "b2-tt")
    assert tt.cfg.dit.block_size == 2 and tt.cfg.decomposition == "tt"
    assert read_train_config(tmp_path / "b2-tt")["data"]["length"] == tt.cfg.dit.length  # the base's, recorded
    out = list(generate(tt.eval(), 4, tok.length // 2, seed=0, sampler="blocks"))[-1].tokens  # one step a block
    assert out.shape == (4, tok.length) and (out != tok.mask_id).all()
    with torch.no_grad():
        assert torch.isfinite(block_log_prob(tt, out)).all()
    scratch = _run(ROOT / "training" / "train_blocks.py", "--block-size", 2, "--out", tmp_path / "b2-cp", *common,
                   "--set", "model.decomposition=cp", "model.rank=3")  # a joint head from scratch, as configured
    assert scratch.wait(timeout=300) == 0, stderr_tail(scratch)
    cp, _, _ = load_checkpoint(tmp_path / "b2-cp")
    assert (cp.cfg.decomposition, cp.cfg.rank, cp.cfg.dit.block_size) == ("cp", 3, 2)
    wrong = _run(ROOT / "training" / "train_blocks.py", "--block-size", 3, "--out", tmp_path / "b3", *common)
    assert wrong.wait(timeout=300) != 0 and "block_size must be 0 (full-sequence) or divide" in stderr_tail(wrong)
    base, base_tok, _ = load_checkpoint(checkpoints / "qm9-base")
    size = next(b for b in (3, 4, 5) if base_tok.length % b)  # one that does not divide: the length is padded
    started = _run(ROOT / "training" / "train_blocks.py", "--block-size", size, "--base", checkpoints / "qm9-base",
                   "--out", tmp_path / "from-base", *common)
    assert started.wait(timeout=300) == 0, stderr_tail(started)
    blocks, blocks_tok, _ = load_checkpoint(tmp_path / "from-base")
    assert blocks.cfg.dit.block_size == size and blocks_tok.length == blocks.cfg.dit.length
    assert blocks.cfg.dit.length == -(-base_tok.length // size) * size and blocks_tok.vocab == base_tok.vocab
    assert blocks.cfg.dit.hidden_dim == base.cfg.dit.hidden_dim and blocks.cfg.decomposition == "none"
    assert read_train_config(tmp_path / "from-base")["data"]["length"] == blocks.cfg.dit.length
