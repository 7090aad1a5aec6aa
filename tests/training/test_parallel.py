"""Data-parallel training (``ttcore.parallel``) with real processes: gloo on CPU, as torchrun starts them."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from ttcore.parallel import Workers

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "qm9_sample.txt"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _averaged_gradient(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    workers = Workers.from_env(torch.device("cpu"))
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)), torch.randn(8, 3)
    workers.broadcast_parameters(model)
    loss = (model(workers.share(x)) - workers.share(y)).pow(2).mean()
    loss.backward()
    workers.average_gradients(list(model.parameters()))
    save_file({n: p.grad.contiguous() for n, p in model.named_parameters()}, f"{out}/{rank}.safetensors")
    dist.destroy_process_group()


def test_averaged_shares_give_the_full_batch_gradient(tmp_path):
    """Two processes, each with half of a batch of 8: after the all-reduce both hold the gradient of the mean
    loss over the whole batch, as one process computes it."""
    mp.spawn(_averaged_gradient, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)), torch.randn(8, 3)
    (model(x) - y).pow(2).mean().backward()
    for rank in (0, 1):
        grads = load_file(tmp_path / f"{rank}.safetensors")
        for n, p in model.named_parameters():
            assert torch.allclose(grads[n], p.grad, atol=1e-6), (rank, n)


@pytest.mark.slow
def test_torchrun_trains_a_tiny_model_on_two_processes_and_resumes(tmp_path):
    """The documented command at its smallest: ``torchrun --nproc_per_node 2 training/pretrain.py``. Process 0
    writes the checkpoint (the run records 2 processes), the replicas end identical (``check_replicas`` raises
    otherwise), the validation loss drops, and a resumed run on two processes continues to the new target."""
    out = tmp_path / "ddp"
    common = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--data", str(SAMPLE), "--out", str(out),
              "--quiet", "--set", "threads=1", "val_every=10"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.run(common + ["--max-steps", "20"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert first.stdout.count("wrote ") == 1, first.stdout  # process 0 only
    state = json.loads((out / "train_state" / "state.json").read_text())
    assert state["step"] == 20 and state["processes"] == 2
    again = subprocess.run(common + ["--max-steps", "40", "--resume"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    state2 = json.loads((out / "train_state" / "state.json").read_text())
    assert state2["step"] == 40 and state2["val"]["nll"] < state["val"]["nll"]


def test_ray_train_runs_the_recipe_as_torchrun_does(tmp_path):
    """``training/ray_train.py``: the same recipe under Ray Train's TorchTrainer (2 workers on a local Ray
    cluster, gloo) writes the checkpoint that ``torchrun --nproc_per_node 2`` writes, weight for weight."""
    pytest.importorskip("ray.train.torch", reason="needs ray[train]")
    recipe = [str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--data", str(SAMPLE), "--quiet",
              "--max-steps", "6", "--set", "threads=1", "val_every=3"]
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", RAY_TMPDIR=short)
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                               "2", *recipe, "--out", str(tmp_path / "torchrun")], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    ray = subprocess.run([sys.executable, str(ROOT / "training" / "ray_train.py"), "--workers", "2", "--", *recipe,
                          "--out", str(tmp_path / "ray")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert ray.returncode == 0, ray.stdout[-2000:] + ray.stderr[-3000:]
    state = json.loads((tmp_path / "ray" / "train_state" / "state.json").read_text())
    assert state["step"] == 6 and state["processes"] == 2
    a, b = load_file(tmp_path / "torchrun" / "model.safetensors"), load_file(tmp_path / "ray" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    shutil.rmtree(short, ignore_errors=True)
