"""``training/distill.py`` end to end at smoke size: distil, resume exactly, serve the student beside its teacher."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import torch
from servers import uvicorn_server

from ttcore.models import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "qm9_sample.txt"
pytestmark = pytest.mark.slow  # training and a server


def _recipe(teacher: Path, out: Path, steps: int, *extra: str) -> list[str]:
    """distill.py's arguments at smoke size (2 student steps of 2 teacher steps, batches of 8)."""
    return [str(ROOT / "training" / "distill.py"), "--config", "qm9_distill", "--teacher", str(teacher), "--data",
            str(SAMPLE), "--steps", "2", "--k", "2", "--out", str(out), "--max-steps", str(steps), "--quiet", "--set",
            "batch_size=8", "precision=fp32", "val_batches=1", "log_every=1", "threads=1", "total_steps=4", *extra]


def _distill(teacher: Path, out: Path, steps: int, *extra: str) -> str:
    done = subprocess.run([sys.executable, *_recipe(teacher, out, steps, *extra)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _distil_and_resume(teacher: Path, tmp_path: Path, *args: str) -> tuple[str, object]:
    """Three steps straight, and one then two more after ``--resume``: the same weights (exact). -> (the straight
    run's stdout, its model)."""
    out = _distill(teacher, tmp_path / "straight", 3, *args)
    _distill(teacher, tmp_path / "resumed", 1, *args)
    _distill(teacher, tmp_path / "resumed", 3, *args, "--resume")
    a, _, _ = load_checkpoint(tmp_path / "straight")
    b, _, _ = load_checkpoint(tmp_path / "resumed")
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))  # exact
    return out, a


def _served(*checkpoints: tuple[Path, str]):
    """A server over copies of ``(directory, name)`` checkpoints (``servers.uvicorn_server``)."""
    served = checkpoints[0][0].parent / "served"
    served.mkdir()
    for directory, name in checkpoints:
        shutil.copytree(directory, served / name)
    return uvicorn_server(served)


def test_distil_resume_exactly_and_serve_the_student_beside_its_teacher(checkpoints, tmp_path):
    teacher = checkpoints / "qm9-tt-r2"
    out, a = _distil_and_resume(teacher, tmp_path)
    assert "budget 6 teacher and 3 student forward passes of 8 sequences" in out, out
    assert a.cfg.extra["distilled"] == {"teacher": "qm9-tt-r2", "objective": "joint", "steps": 2,
                                        "teacher_steps": 4, "teacher_ordering": "random", "states": "student"}
    with _served((tmp_path / "straight", "qm9-tt-r2-d2"), (teacher, "qm9-tt-r2")) as url:
        infos = {m["checkpoint"]: m for m in httpx.get(url + "/models").json()["models"]}
        assert infos["qm9-tt-r2-d2"]["distilled"]["steps"] == 2 and infos["qm9-tt-r2"]["distilled"] is None
        named = httpx.post(url + "/generate", json={"checkpoint": "qm9-tt-r2-d2", "num_samples": 2}, timeout=60)
        assert named.status_code == 200 and named.json()["checkpoint"] == "qm9-tt-r2-d2", named.text
        assert named.json()["steps"] == 2  # no steps asked: the count it was distilled for
        plain = httpx.post(url + "/generate", json={"model": "qm9", "num_samples": 2}, timeout=60).json()
        assert plain["checkpoint"] == "qm9-tt-r2" and plain["steps"] == 16  # the general default: the teacher
        few = httpx.post(url + "/generate", json={"model": "qm9", "num_samples": 2, "steps": 2}, timeout=60).json()
        assert few["checkpoint"] == "qm9-tt-r2-d2"  # a request within its steps: the specialist
        v1 = httpx.post(url + "/v1/completions", json={"model": "qm9-tt-r2-d2", "prompt": "C"}, timeout=60).json()
        assert v1["ttcore"]["checkpoint"] == "qm9-tt-r2-d2" and v1["ttcore"]["steps"] == 2, v1
        wrong = httpx.post(url + "/generate", json={"checkpoint": "qm9-tt-r2-d2", "decomposition": "cp"}, timeout=60)
        assert wrong.status_code == 404 and "checkpoint='qm9-tt-r2-d2'" in wrong.text


def test_di4c_distils_a_rank1_base_into_a_mixture_resumes_exactly_and_serves(checkpoints, tmp_path):
    """``--objective di4c``: the rank-1 base becomes a mixture student (a latent z redrawn every step), the run
    resumes exactly (its z and composition draws come from the recipe's generator), and the service names it
    ``di4c`` and generates from it; its likelihood is an integral over z, so ``/score`` refuses it."""
    teacher = checkpoints / "qm9-base"
    args = ("--objective", "di4c", "--states", "data", "--latent-dim", "4")
    out, a = _distil_and_resume(teacher, tmp_path, *args)
    assert f"budget 9 teacher and {3 * 32} student forward passes of 8 sequences" in out, out  # (k + 1), 2 x 16
    assert a.cfg.latent_draw == "step" and a.latent_dim == 4 and a.recognition is None
    assert a.backbone.latent_map.weight.abs().sum() > 0  # the mixture moved away from the base
    with _served((tmp_path / "straight", "qm9-di4c")) as url:
        info = httpx.get(url + "/models").json()["models"][0]
        assert info["base"] == "di4c" and info["distilled"]["objective"] == "di4c", info
        got = httpx.post(url + "/generate", json={"model": "qm9", "num_samples": 3, "seed": 1}, timeout=60)
        assert got.status_code == 200 and got.json()["steps"] == 2, got.text
        again = httpx.post(url + "/generate", json={"model": "qm9", "num_samples": 3, "seed": 1}, timeout=60)
        assert again.json()["samples"] == got.json()["samples"]  # seeded: z comes from the request's streams
        score = httpx.post(url + "/score", json={"model": "qm9", "sequences": ["CCO"]}, timeout=60)
        assert score.status_code == 422 and "di4c model" in score.text, score.text


def test_a_student_grown_past_its_teachers_rank_distils_resumes_exactly_and_serves(checkpoints, tmp_path):
    """``--student-rank 4`` from a TT r = 2 teacher: the student is a rank-4 TT (the teacher's joint at the start,
    ``tests/decompositions/test_grow_rank.py``), resumes exactly (the grown weights are not drawn again) and
    serves with its rank and distillation in ``GET /models``."""
    teacher = checkpoints / "qm9-tt-r2"
    grow = ("--student-rank", "4", "--states", "data")
    _, a = _distil_and_resume(teacher, tmp_path, *grow)
    assert a.cfg.rank == 4 and a.cfg.extra["distilled"]["teacher"] == "qm9-tt-r2"
    with _served((tmp_path / "straight", "qm9-tt-r4-d2")) as url:
        info = httpx.get(url + "/models").json()["models"][0]
        assert info["rank"] == 4 and info["distilled"]["teacher"] == "qm9-tt-r2", info
        done = httpx.post(url + "/generate", json={"checkpoint": "qm9-tt-r4-d2", "num_samples": 3}, timeout=60)
        assert done.status_code == 200 and len(done.json()["samples"]) == 3 and done.json()["steps"] == 2, done.text


def test_progressive_rounds_write_the_last_student_to_out_and_serve_it(checkpoints, tmp_path):
    """``--rounds 2`` from a TT r = 2 teacher: round 1 distils 8 teacher steps into 4 (``OUT-round-1``), round 2
    those 4 into 2 (OUT itself, the checkpoint a user serves); the budget counts both rounds; a ``--resume`` of the
    finished run trains nothing more (both rounds' weights unchanged); the service shows the rounds."""
    teacher, out = checkpoints / "qm9-tt-r2", tmp_path / "qm9-tt-r2-p2"
    printed = _distill(teacher, out, 2, "--rounds", "2", "--states", "data")
    assert "2 steps (joint, 2 round(s)); budget 8 teacher and 4 student forward passes of 8 sequences" in printed
    first, _, _ = load_checkpoint(tmp_path / "qm9-tt-r2-p2-round-1")
    last, _, _ = load_checkpoint(out)
    assert first.cfg.extra["distilled"] == {"teacher": "qm9-tt-r2", "objective": "joint", "steps": 4,
                                            "teacher_steps": 8, "teacher_ordering": "random", "states": "data",
                                            "rounds": 2, "first_teacher": "qm9-tt-r2"}
    assert last.cfg.extra["distilled"]["teacher"] == "qm9-tt-r2-p2-round-1"
    assert last.cfg.extra["distilled"]["steps"] == 2 and last.cfg.extra["distilled"]["teacher_steps"] == 4
    assert not all(torch.equal(p, q) for p, q in zip(first.state_dict().values(), last.state_dict().values()))
    _distill(teacher, out, 2, "--rounds", "2", "--states", "data", "--resume")
    again, _, _ = load_checkpoint(out)
    assert all(torch.equal(p, q) for p, q in zip(last.state_dict().values(), again.state_dict().values()))
    with _served((out, "qm9-tt-r2-p2")) as url:
        info = httpx.get(url + "/models").json()["models"][0]
        assert info["distilled"]["rounds"] == 2 and info["distilled"]["first_teacher"] == "qm9-tt-r2", info
        done = httpx.post(url + "/generate", json={"checkpoint": "qm9-tt-r2-p2", "num_samples": 2}, timeout=60)
        assert done.status_code == 200 and done.json()["steps"] == 2, done.text


def _torchrun(checkpoints: Path, out: Path, steps: int, *extra: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *_recipe(checkpoints / "qm9-tt-r2", out, steps, *extra)], cwd=ROOT, capture_output=True,
                          text=True, env=env or dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_torchrun_distils_on_two_processes_and_resumes_exactly(checkpoints, tmp_path):
    """``torchrun --nproc_per_node 2 training/distill.py``: each process distils its share of the batch with its
    own teacher streams; process 0 writes the student, the replicas end identical (``check_replicas``), and 1 step
    then a resumed 2 give the weights of 3 steps in one run, bit for bit."""
    printed = _torchrun(checkpoints, tmp_path / "straight", 3)
    assert printed.count("distilled ") == 1, printed  # process 0 only
    assert json.loads((tmp_path / "straight" / "train_state" / "state.json").read_text())["processes"] == 2
    _torchrun(checkpoints, tmp_path / "resumed", 1)
    _torchrun(checkpoints, tmp_path / "resumed", 3, "--resume")
    a, _, _ = load_checkpoint(tmp_path / "straight")
    b, _, _ = load_checkpoint(tmp_path / "resumed")
    assert a.cfg.extra["distilled"]["teacher"] == "qm9-tt-r2"
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_text_distill_config_distils_a_text_model(checkpoints, tmp_path):
    """The documented text command's config (``text_distill``: the text corpus, batches of 16) at its smallest: the
    tiny text model distilled for 2 steps, its record written and served with its steps."""
    done = subprocess.run([sys.executable, str(ROOT / "training" / "distill.py"), "--config", "text_distill",
                           "--teacher", str(checkpoints / "text-base"), "--steps", "2", "--k", "2", "--states", "data",
                           "--out", str(tmp_path / "text-d2"), "--max-steps", "2", "--quiet", "--set", "batch_size=4",
                           "data.length=32", "precision=fp32", "val_batches=1", "threads=1", "total_steps=2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "budget 4 teacher and 2 student forward passes of 4 sequences" in done.stdout, done.stdout
    student, _, _ = load_checkpoint(tmp_path / "text-d2")
    assert student.cfg.extra["family"] == "text" and student.cfg.extra["distilled"]["teacher"] == "text-base"
    with _served((tmp_path / "text-d2", "text-d2")) as url:
        got = httpx.post(url + "/generate", json={"checkpoint": "text-d2", "num_samples": 2}, timeout=60)
        assert got.status_code == 200 and got.json()["steps"] == 2, got.text


def test_ray_train_distils_as_torchrun_does(checkpoints, tmp_path):
    """``training/ray_train.py training/distill.py ...``: the recipe under Ray Train's TorchTrainer (2 workers, gloo)
    writes the student that ``torchrun --nproc_per_node 2`` writes, weight for weight."""
    pytest.importorskip("ray.train.torch", reason="needs ray[train]")
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", RAY_TMPDIR=short)
    try:
        _torchrun(checkpoints, tmp_path / "torchrun", 2, env=env)
        ray = subprocess.run([sys.executable, str(ROOT / "training" / "ray_train.py"), "--workers", "2", "--",
                              *_recipe(checkpoints / "qm9-tt-r2", tmp_path / "ray", 2)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
        assert ray.returncode == 0, ray.stdout[-2000:] + ray.stderr[-3000:]
        assert json.loads((tmp_path / "ray" / "train_state" / "state.json").read_text())["processes"] == 2
        a, _, _ = load_checkpoint(tmp_path / "torchrun")
        b, _, _ = load_checkpoint(tmp_path / "ray")
        assert b.cfg.extra["distilled"]["teacher"] == "qm9-tt-r2"
        assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    finally:  # a failed run leaves no Ray session behind (its logs fill /tmp)
        shutil.rmtree(short, ignore_errors=True)
