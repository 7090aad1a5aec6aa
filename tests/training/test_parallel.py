"""Data-parallel training (``ttcore.parallel``) with real processes: gloo on CPU, as torchrun starts them."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from servers import free_port

from ttcore.losses import mdlm_loss
from ttcore.models import DiTConfig, JointModel, ModelConfig
from ttcore.parallel import Workers

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "qm9_sample.txt"


def _averaged_gradient(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    workers = Workers.from_env(torch.device("cpu"))
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    model.unused = torch.nn.Parameter(torch.ones(2))  # no process reaches it
    x, y = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)), torch.randn(8, 3)
    workers.broadcast_parameters(model)
    loss = (model(workers.share(x)) - workers.share(y)).pow(2).mean()
    loss.backward()
    workers.average_gradients(list(model.parameters()))
    assert model.unused.grad is None  # as in one process, so AdamW skips it (a zero gradient would decay it)
    save_file({n: p.grad.contiguous() for n, p in model.named_parameters() if p.grad is not None},
              f"{out}/{rank}.safetensors")
    dist.destroy_process_group()


@pytest.mark.slow  # process groups (gloo)
def test_averaged_shares_give_the_full_batch_gradient(tmp_path):
    """Two processes, each with half of a batch of 8: after the all-reduce both hold the gradient of the mean
    loss over the whole batch, as one process computes it, and a parameter no process reached has none."""
    mp.spawn(_averaged_gradient, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)), torch.randn(8, 3)
    (model(x) - y).pow(2).mean().backward()
    for rank in (0, 1):
        grads = load_file(tmp_path / f"{rank}.safetensors")
        assert set(grads) == {"weight", "bias"}
        for n, p in model.named_parameters():
            assert torch.allclose(grads[n], p.grad, atol=1e-6), (rank, n)


V, L, B = 5, 6, 4


def _tt_batch():
    """A tiny TT model and a global batch of 4 whose two shares (rows 0, 2 and 1, 3) hold 11 and 6 masked
    tokens: a mean of per-share means weighs them unequally."""
    torch.manual_seed(0)
    model = JointModel(ModelConfig(DiTConfig(vocab_size=V + 1, out_vocab=V, length=L, hidden_dim=16, cond_dim=8,
                                             n_blocks=1, n_heads=2), decomposition="tt", rank=3))
    x0 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[0, :6] = mask[2, :5] = True  # share 0: 11
    mask[1, :4] = mask[3, :2] = True  # share 1: 6
    return model, x0, torch.tensor([0.9, 0.5, 0.8, 0.3]), mask


def _real_loss_gradient(rank: int, world: int, port: int, out: str, marginal_weight: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    workers = Workers.from_env(torch.device("cpu"))
    model, x0, t, mask = _tt_batch()
    share = workers.share
    losses = mdlm_loss(model, share(x0), V, t=share(t), mask=share(mask), marginal_weight=marginal_weight,
                       processes=workers)
    losses["loss"].backward()
    workers.average_gradients(list(model.parameters()))
    save_file({n: p.grad.contiguous() for n, p in model.named_parameters() if p.grad is not None},
              f"{out}/{rank}.safetensors")
    dist.destroy_process_group()


@pytest.mark.slow  # process groups (gloo)
@pytest.mark.parametrize("marginal_weight", [0.0, 0.5])
def test_data_parallel_mdlm_loss_gives_the_single_process_gradient(tmp_path, marginal_weight):
    """The real objective (joint NLL + L_C of Eq. 19, plus the marginal-consistency term) on two processes whose
    shares hold 11 and 6 masked tokens: after the all-reduce each holds the gradient one process computes on the
    whole batch (the global per-token mean). A mean of the two per-share means is 7% off here, so this fails
    if any term is normalized by a share's own count."""
    mp.spawn(_real_loss_gradient, args=(2, free_port(), str(tmp_path), marginal_weight), nprocs=2, join=True)
    model, x0, t, mask = _tt_batch()
    whole = mdlm_loss(model, x0, V, t=t, mask=mask, marginal_weight=marginal_weight)
    assert whole["lc"] > 0  # the TT's L_C term is part of what is compared
    whole["loss"].backward()
    reference = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    # the mean of per-share means, as the recipe computed it before: measurably different
    model.zero_grad()
    halves = [mdlm_loss(model, x0[r::2], V, t=t[r::2], mask=mask[r::2], marginal_weight=marginal_weight)["loss"]
              for r in (0, 1)]
    (sum(halves) / 2).backward()
    ref_flat = torch.cat([g.flatten() for g in reference.values()])
    naive = torch.cat([model.get_parameter(n).grad.flatten() for n in reference])
    assert (naive - ref_flat).norm() / ref_flat.norm() > 0.01
    for rank in (0, 1):
        grads = load_file(tmp_path / f"{rank}.safetensors")
        assert grads.keys() == reference.keys()
        got = torch.cat([grads[n].flatten() for n in reference])
        assert (got - ref_flat).norm() / ref_flat.norm() < 1e-5, rank


@pytest.mark.slow
def test_torchrun_trains_a_tiny_model_on_two_processes_and_resumes_exactly(tmp_path):
    """The documented command at its smallest: ``torchrun --nproc_per_node 2 training/pretrain.py``. Process 0
    writes the checkpoint (the run records 2 processes and both processes' mask streams), the replicas end
    identical (``check_replicas`` raises otherwise), the validation loss drops, and 10 steps then a resumed 10
    give the weights of 20 steps in one run, bit for bit (process 1's mask stream continues too)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def torchrun(out, *extra):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--data", str(SAMPLE),
                               "--out", str(out), "--quiet", "--set", "threads=1", "val_every=10", *extra], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done, json.loads((out / "train_state" / "state.json").read_text())

    first, state = torchrun(tmp_path / "ddp", "--max-steps", "10")
    assert first.stdout.count("wrote ") == 1, first.stdout  # process 0 only
    assert state["step"] == 10 and state["processes"] == 2
    assert "rng.generator.1" in load_file(tmp_path / "ddp" / "train_state" / "state.safetensors")
    _, state2 = torchrun(tmp_path / "ddp", "--max-steps", "20", "--resume")
    assert state2["step"] == 20 and state2["val"]["nll"] < state["val"]["nll"] and "reseeded" not in state2
    torchrun(tmp_path / "straight", "--max-steps", "20")
    a = load_file(tmp_path / "ddp" / "model.safetensors")
    b = load_file(tmp_path / "straight" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _torchrun(out, recipe: list, env: dict) -> None:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *recipe, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def _ray_train(out, recipe: list, env: dict) -> None:
    ray = subprocess.run([sys.executable, str(ROOT / "training" / "ray_train.py"), "--workers", "2", "--", *recipe,
                          "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert ray.returncode == 0, ray.stdout[-2000:] + ray.stderr[-3000:]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow  # Ray
def test_ray_train_runs_the_recipe_as_torchrun_does(tmp_path):
    """``training/ray_train.py``: the same recipe under Ray Train's TorchTrainer (2 workers on a local Ray
    cluster, gloo) writes the checkpoint that ``torchrun --nproc_per_node 2`` writes, weight for weight."""
    pytest.importorskip("ray.train.torch", reason="needs ray[train]")
    recipe = [str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--data", str(SAMPLE), "--quiet",
              "--max-steps", "6", "--set", "threads=1", "val_every=3"]
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", RAY_TMPDIR=short)
    try:
        _torchrun(tmp_path / "torchrun", recipe, env)
        _ray_train(tmp_path / "ray", recipe, env)
        state = json.loads((tmp_path / "ray" / "train_state" / "state.json").read_text())
        assert state["step"] == 6 and state["processes"] == 2
        assert _same_weights(tmp_path / "torchrun", tmp_path / "ray")
    finally:  # a failed run leaves no Ray session behind (its logs fill /tmp)
        shutil.rmtree(short, ignore_errors=True)


def test_the_local_ray_trainer_runs_without_the_placement_group_cleaner(monkeypatch):
    """``ray_train.trainer_class``: on the local cluster no detached actor may remove the run's placement group
    on a false "controller dead" from the state API (``trainer_class``'s docstring); Ray's other callbacks stay."""
    pytest.importorskip("ray.train.torch", reason="needs ray[train]")
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import ray_train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    def names(trainer_cls):
        trainer = trainer_cls(lambda config: None, scaling_config=ScalingConfig(num_workers=1))
        return [type(c) for c in trainer._create_default_callbacks()]
    default, local = names(TorchTrainer), names(ray_train.trainer_class())
    assert PlacementGroupCleanerCallback in default and PlacementGroupCleanerCallback not in local
    assert [c for c in default if c is not PlacementGroupCleanerCallback] == local


@pytest.mark.slow  # process groups (torchrun)
def test_the_block_recipe_runs_data_parallel_under_torchrun(tmp_path):
    """``training/train_blocks.py`` (its own objective, ``ModelKind.objective``: each process its share, the
    gradients averaged) on two processes: 3 steps then a resumed 3 give the weights of 6 in one run, bit for bit,
    and the model stays block-causal. (Ray Train runs any recipe as torchrun does: the test above, on pretrain.)"""
    recipe = [str(ROOT / "training" / "train_blocks.py"), "--config", "tiny", "--data", str(SAMPLE), "--quiet",
              "--block-size", "2", "--set", "threads=1", "val_every=3"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    _torchrun(tmp_path / "ddp", [*recipe, "--max-steps", "3"], env)
    _torchrun(tmp_path / "ddp", [*recipe, "--max-steps", "6", "--resume"], env)
    _torchrun(tmp_path / "straight", [*recipe, "--max-steps", "6"], env)
    state = json.loads((tmp_path / "ddp" / "train_state" / "state.json").read_text())
    assert state["step"] == 6 and state["processes"] == 2 and "reseeded" not in state
    assert _same_weights(tmp_path / "ddp", tmp_path / "straight")
    config = json.loads((tmp_path / "ddp" / "config.json").read_text())
    assert config["model"]["dit"]["block_size"] == 2
