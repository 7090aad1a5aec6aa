"""training/evaluate.py on the tiny checkpoints: tables, CSV/JSON and plots are written."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.slow  # servers, Ray, training or end-to-end commands


def test_evaluate_writes_results(checkpoints, tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "training/evaluate.py", "--checkpoints", str(checkpoints / "qm9-base"),
           str(checkpoints / "qm9-tt-r2"), "--out", str(out), "--samples", "48", "--batch", "24", "--steps", "1", "4",
           "--orderings", "random", "top_prob", "--eb-gammas", "0.0", "5.0", "--eb-max-steps", "30",
           "--data", str(ROOT / "tests" / "data" / "qm9_sample.txt"), "--precision", "fp32",
           "--contractions", "head", "exact", "--rank-one-view", "--distribution"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    # TT with random order: both contractions; TT's rank-1 view: each ordering and K once more, random order
    # also with the exact contraction (the view follows the joint the step would draw from)
    assert len(rows) == 2 * (2 * 2 + 2) + 2 + 2 * 2 + 2
    assert {r["checkpoint"] for r in rows if not r["joint"]} == {"qm9-tt-r2"}
    assert "qm9-tt-r2 rank-1 view" in done.stdout and "qm9-tt-r2 exact rank-1 view" in done.stdout
    # MOSES-style metrics for every fixed-sampler row with two valid molecules or more, and the data floor
    assert "MOSES-style metrics against" in done.stdout and "QM9 training molecules" in done.stdout
    for r in rows:
        if r["eb_gamma"] is None and r["n_valid"] >= 2:
            assert r["fcd"] >= 0 and 0 <= r["snn"] <= 1 and 0 <= r["int_div"] <= 1, r
    assert {r["contraction"] for r in rows if r["checkpoint"] == "qm9-tt-r2" and r["ordering"] == "random"} == {
        "head", "exact"}
    assert "qm9-tt-r2 exact" in done.stdout
    assert all(0 <= r["validity"] <= 1 and r["samples"] == 48 for r in rows)
    eb = {r["eb_gamma"]: r["avg_steps"] for r in rows if r["checkpoint"] == "qm9-base" and r["eb_gamma"] is not None}
    assert eb[0.0] > eb[5.0]  # gamma = 0 unmasks one token per step: the most steps
    fixed = [r for r in rows if r["eb_gamma"] is None and r["steps"] == 1]
    assert all(r["avg_steps"] == 1 for r in fixed)
    assert (out / "validity.png").stat().st_size > 10_000 and (out / "eb.png").exists()
    assert (out / "results.csv").read_text().startswith("checkpoint,decomposition,rank")
    assert "validity % / uniqueness % / novelty %, ordering top_prob" in done.stdout


def test_a_block_checkpoints_molecules_are_drawn_by_its_sampler_and_what_it_refuses_is_skipped(checkpoints, tmp_path):
    """evaluate.py on a block TT: K = one step a block and two are its sampler's rows (joint and rank-1 view);
    EB-Sampler, which a block model does not take, is a line saying so, not a crash (the default EB lines
    asked for K = 128 and stopped the whole evaluation)."""
    from servers import make_block_checkpoint

    blocks = make_block_checkpoint(tmp_path / "ck" / "qm9-blocks", checkpoints / "qm9-base", block_size=2)
    n = json.loads((blocks / "config.json").read_text())["model"]["dit"]["length"] // 2
    out = tmp_path / "results"
    cmd = [sys.executable, "training/evaluate.py", "--checkpoints", str(blocks), "--out", str(out), "--samples",
           "16", "--batch", "16", "--steps", str(n), str(2 * n), "--orderings", "random", "--eb-gammas", "0.5",
           "--rank-one-view", "--data", str(ROOT / "tests" / "data" / "qm9_sample.txt"), "--precision", "fp32"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert sorted((r["joint"], r["steps"], r["avg_steps"]) for r in rows) == [
        (False, n, n), (False, 2 * n, 2 * n), (True, n, n), (True, 2 * n, 2 * n)]
    assert "EB gamma=0.5: skipped, a block diffusion model refuses it (steps: " in done.stdout
    moses = subprocess.run([sys.executable, "training/evaluate_moses.py", "--checkpoints", str(blocks), "--samples",
                            "8", "--batch", "8", "--steps", str(n), "--eb-gammas", "0.5", "--samples-dir",
                            str(tmp_path / "kept"), "--sample-only", "--precision", "fp32"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)  # evaluate_moses.py the same way
    assert moses.returncode == 0, moses.stderr[-3000:]
    assert f"random K={n}: 8 samples" in moses.stdout and "EB gamma=0.5: skipped" in moses.stdout


def test_evaluate_text_writes_genppl(tmp_path):
    """A tiny text model and its TT fine-tune, judged by the packaged SmolLM2: files written, GenPPL finite and
    > 1; the TT checkpoint's rank-1 view (joint: false) is a line of its own."""
    small = ["--set", "data=text", "family=text", "bpe_vocab=512", "length=32", "threads=1"]
    base = subprocess.run([sys.executable, "training/pretrain.py", "--config", "tiny", "--out", str(tmp_path / "b"),
                           "--max-steps", "5", "--quiet", *small], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert base.returncode == 0, base.stderr[-2000:]
    ft = subprocess.run([sys.executable, "training/finetune.py", "--config", "tiny", "--base", str(tmp_path / "b"),
                         "--decomposition", "tt", "--rank", "2", "--out", str(tmp_path / "tt"), "--max-steps", "3",
                         "--quiet", *small], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ft.returncode == 0, ft.stderr[-2000:]
    out = tmp_path / "res"
    done = subprocess.run([sys.executable, "training/evaluate.py", "--data", "text", "--checkpoints",
                           str(tmp_path / "b"), str(tmp_path / "tt"), "--out", str(out), "--samples", "4", "--batch",
                           "4", "--steps", "2", "8", "--precision", "fp32", "--cards", "--rank-one-view"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((out / "text_results.json").read_text())
    assert [(r["checkpoint"], r["joint"], r["steps"]) for r in rows] == [
        ("b", True, 2), ("b", True, 8), ("tt", True, 2), ("tt", True, 8), ("tt", False, 2), ("tt", False, 8)]
    assert all(1 < r["genppl"] < 1e7 and r["entropy"] > 0 for r in rows)
    assert (out / "genppl.png").exists() and "GenPPL (entropy)" in done.stdout and "tt rank-1 view |" in done.stdout
    card = (tmp_path / "b" / "model_card.md").read_text()
    assert card.count("## Few-step quality") == 1 and f"| random | 8 | {rows[1]['genppl']:.1f} |" in card
    card = (tmp_path / "tt" / "model_card.md").read_text()
    assert f"| random (rank-1 view, joint: false) | 8 | {rows[5]['genppl']:.1f} |" in card
    # only the rank-1 view, with the joint rows of the first run merged in: the same draws, the same numbers
    (out / "first.json").write_text(json.dumps(rows[:4]))
    again = subprocess.run([sys.executable, "training/evaluate.py", "--data", "text", "--checkpoints",
                            str(tmp_path / "tt"), "--out", str(tmp_path / "res2"), "--samples", "4", "--batch", "4",
                            "--steps", "2", "8", "--precision", "fp32", "--rank-one-view", "only", "--merge",
                            str(out / "first.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    merged = json.loads((tmp_path / "res2" / "text_results.json").read_text())
    assert [(r["checkpoint"], r["joint"], r["genppl"]) for r in merged] == [
        (r["checkpoint"], r["joint"], r["genppl"]) for r in rows]
    # adaptive samplers on both paths: a line each for the joint, one (exact = fast in law) for rank 1
    third = subprocess.run([sys.executable, "training/evaluate.py", "--data", "text", "--checkpoints",
                            str(tmp_path / "b"), str(tmp_path / "tt"), "--out", str(tmp_path / "res3"), "--samples",
                            "4", "--batch", "4", "--steps", "4", "--precision", "fp32", "--text-samplers", "top_prob",
                            "eb=0.5", "block_eb=0.5", "--adaptive-paths", "exact", "fast"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    adaptive = json.loads((tmp_path / "res3" / "text_results.json").read_text())
    assert sorted((r["checkpoint"], r["sampler"], r["adaptive_path"]) for r in adaptive) == [
        ("b", "eb=0.5", "exact"), ("b", "top_prob", "exact"), ("tt", "eb=0.5", "exact"), ("tt", "eb=0.5", "fast"),
        ("tt", "top_prob", "exact"), ("tt", "top_prob", "fast")]
    assert "tt top_prob fast |" in third.stdout and all(1 < r["genppl"] < 1e7 for r in adaptive)
    assert third.stdout.count("block_eb=0.5 K=4: skipped") == 2, third.stdout  # EB inside a block: no blocks here
    # a block TT (b = 8, from the TT) is drawn by its kind's sampler, block by block: its joint and its rank-1 view
    blk = subprocess.run([sys.executable, "training/train_blocks.py", "--config", "tiny",
                          "--base", str(tmp_path / "tt"), "--block-size", "8", "--out", str(tmp_path / "blk"),
                          "--max-steps", "2", "--quiet", *small],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert blk.returncode == 0, blk.stderr[-2000:]
    fourth = subprocess.run([sys.executable, "training/evaluate.py", "--data", "text", "--checkpoints",
                             str(tmp_path / "blk"), "--out", str(tmp_path / "res4"), "--samples", "4", "--batch", "4",
                             "--steps", "4", "8", "--precision", "fp32", "--rank-one-view", "--text-samplers",
                             "random", "block_eb=0.5"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    blocks = json.loads((tmp_path / "res4" / "text_results.json").read_text())
    assert [(r["joint"], r["sampler"], r["steps"]) for r in blocks] == [
        (True, "random", 4), (True, "random", 8), (True, "block_eb=0.5", 4), (True, "block_eb=0.5", 8),
        (False, "random", 4), (False, "random", 8)]
    assert [r["avg_steps"] for r in blocks if r["sampler"] == "random"] == [4, 8, 4, 8]  # 4 blocks of 8: 1, 2 a block
    eb = [r["avg_steps"] for r in blocks if r["sampler"] != "random"]  # EB: a step a block at least, K at most
    assert eb[0] == 4 and 4 <= eb[1] <= 8, eb  # K = 4 blocks: the deadline takes each block in one step
    assert all(1 < r["genppl"] < 1e7 for r in blocks)


def test_count_schedule_identifies_runs_that_only_differ_by_idle_steps():
    from _report import count_schedule

    assert count_schedule(22, 32) == count_schedule(22, 64) == (1,) * 22  # K >= l: one token a step
    assert count_schedule(22, 16) != count_schedule(22, 32)
    few = count_schedule(22, 8)
    assert len(few) == 8 and sum(few) == 22


def test_cards_get_one_quality_section(checkpoints, tmp_path):
    import shutil

    ckpt = tmp_path / "qm9-base"
    shutil.copytree(checkpoints / "qm9-base", ckpt)
    before = (ckpt / "model_card.md").read_text()
    cmd = [sys.executable, "training/evaluate.py", "--checkpoints", str(ckpt), "--out", str(tmp_path / "r"),
           "--samples", "8", "--batch", "8", "--steps", "1", "--orderings", "random", "--eb-gammas",
           "--data", str(ROOT / "tests" / "data" / "qm9_sample.txt"), "--precision", "fp32", "--cards"]
    (ckpt / "model_card.md").write_text(before + "\n## Distribution metrics (MOSES-style)\n\nold table\n")
    for extra in ([], [], ["--distribution", "--eb-gammas", "1.0"]):  # re-running replaces the section
        done = subprocess.run(cmd + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        card = (ckpt / "model_card.md").read_text()
        assert card.startswith(before.rstrip("\n")) and card.count("## Few-step quality") == 1
        assert "| random | 1 | 1.0 |" in card and "--cards" in card
        assert "Distribution metrics" not in card  # the old separate section went: one table per card
    # with --distribution the metrics are columns of the one table; EB rows have none
    assert "| novelty % | quality % | FCD | SNN | Frag | Scaf | IntDiv |" in card and "training molecules: FCD" in card
    eb_row = next(line for line in card.splitlines() if line.startswith("| EB-Sampler"))
    assert eb_row.endswith("| - | - | - | - | - |")


def test_replace_section_keeps_the_sections_around_it():
    from _report import replace_section

    card = "# m\n\n## A\n\na\n\n## B\n\nb\n\n## C\n\nc\n"
    assert replace_section(card, "## B", "## B\n\nnew") == "# m\n\n## A\n\na\n\n## B\n\nnew\n\n## C\n\nc\n"
    assert replace_section(card, "## C", "## C\n\nz") == "# m\n\n## A\n\na\n\n## B\n\nb\n\n## C\n\nz\n"
    assert replace_section(card, "## D", "## D\n\nd").endswith("## C\n\nc\n\n## D\n\nd\n")


def test_likelihood_metrics_and_head_error_replace_the_cards_validation_line(checkpoints, tmp_path):
    """A block diffusion checkpoint (an exact likelihood) gets its exact perplexity, not an ELBO's."""
    import shutil

    from servers import make_block_checkpoint

    for name in ("qm9-base", "qm9-tt-r2"):
        shutil.copytree(checkpoints / name, tmp_path / "ck" / name)
    make_block_checkpoint(tmp_path / "ck" / "qm9-blocks", checkpoints / "qm9-base")
    cmd = [sys.executable, "training/evaluate_likelihood.py", "--checkpoints", str(tmp_path / "ck"), "--out",
           str(tmp_path / "r"), "--data", str(ROOT / "tests" / "data" / "qm9_sample.txt"), "--precision", "fp32",
           "--cards"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["checkpoint"]: r for r in json.loads((tmp_path / "r" / "likelihood.json").read_text())}
    base, tt, blocks = rows["qm9-base"], rows["qm9-tt-r2"], rows.pop("qm9-blocks")
    assert "elbo_ppl" not in blocks and blocks["exact_ppl"] == pytest.approx(math.exp(blocks["exact_nll_real"]))
    assert blocks["exact_nll_real"] > blocks["nll"] > 0  # the same nats over the real tokens, not every position
    card = (tmp_path / "ck" / "qm9-blocks" / "model_card.md").read_text()
    line = next(x for x in card.splitlines() if x.startswith("- validation"))
    assert "re-measured by" in line and "-log p(x)" in line and "(exact" in line, line
    assert "exact perplexity" in done.stdout
    assert abs(base["nll"] - base["marginal_nll"]) < 1e-5  # rank 1: the joint is its marginals
    assert tt["marginal_nll"] > 0 and 0 < tt["nelbo"] < 20 and "head_tv_mean" not in base
    for row in (base, tt):  # the ELBO perplexity through ttcore.scoring.elbo (as POST /score computes it)
        assert row["elbo_ppl"] == pytest.approx(math.exp(row["elbo_nll"])) and row["elbo_stderr"] > 0
        # one bound, per real token (SMILES pad: every position's term) against the validation's per position
        assert row["elbo_terms"] == "all" and row["elbo_nll"] > 0.8 * row["nelbo"]
    assert 0 <= tt["head_tv_mean"] <= tt["head_tv_max"] <= 1 and tt["head_tv_positions"] > 0
    for name in rows:
        card = (tmp_path / "ck" / name / "model_card.md").read_text()
        line = next(x for x in card.splitlines() if x.startswith("- validation"))
        assert "re-measured by" in line and "marginal NLL" in line and "NELBO" in line, line


def test_schedules_and_temperatures_are_lines_of_their_own(checkpoints, tmp_path):
    """Each schedule x temperature is its own row and line; a cold softmax repeats molecules more often."""
    out = tmp_path / "r"
    cmd = [sys.executable, "training/evaluate.py", "--checkpoints", str(checkpoints / "qm9-base"), "--out", str(out),
           "--samples", "64", "--batch", "32", "--steps", "4", "--orderings", "random", "--eb-gammas",
           "--schedules", "loglinear", "cosine", "--temperatures", "1.0", "0.05",
           "--data", str(ROOT / "tests" / "data" / "qm9_sample.txt"), "--precision", "fp32"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r["schedule"], r["temperature"]): r for r in json.loads((out / "results.json").read_text())}
    assert set(rows) == {("loglinear", 1.0), ("loglinear", 0.05), ("cosine", 1.0), ("cosine", 0.05)}
    assert "qm9-base cosine T=0.05" in done.stdout and "qm9-base T=0.05" in done.stdout
    assert all(r["samples"] == 64 for r in rows.values())
    from _report import count_schedule, run_setting

    from ttcore.models import load_for_inference

    assert count_schedule(22, 4, "cosine") != count_schedule(22, 4) and sum(count_schedule(22, 4, "cosine")) == 22
    model, tok, _ = load_for_inference(checkpoints / "qm9-base", "cpu", "fp32")
    distinct = {t: len(set(run_setting(model, tok, 64, 4, 32, 0, ordering="random", temperature=t)["texts"]))
                for t in (1.0, 0.05)}
    assert distinct[0.05] < distinct[1.0]  # the temperature reaches the sampler


def test_settings_are_micro_batched_within_the_memory_budget(checkpoints):
    from _report import rows_within, run_setting

    from ttcore.models import load_for_inference
    from ttcore.sampling import cost

    model, tok, _ = load_for_inference(checkpoints / "qm9-tt-r2", "cpu", "fp32")
    per_row = cost.step_row_bytes(model.cfg, True)  # adaptive: full cores per sequence
    chain = dict(ordering="top_prob", adaptive_path="exact")  # the chain rule
    assert rows_within(model, 1, **chain) == 1  # never zero: one sequence a pass at least
    assert rows_within(model, 64, **chain) == (64 << 20) // per_row
    assert rows_within(model, 64, joint=False) == rows_within(model, 64, contraction="exact")  # exact marginals at T
    assert rows_within(model, 64, joint=False, ordering="top_prob") == (64 << 20) // per_row  # ranks every marginal
    assert rows_within(model, 64, ordering="random") >= rows_within(model, 64, **chain)
    res = run_setting(model, tok, 12, 4, 12, 0, 1, **chain)  # twelve passes of one sequence
    assert len(res["texts"]) == 12 and res["avg_steps"] == 4
