"""The bundled training suites: the QM9 fine-tunes of one base at equal budgets (none, CP r=64, TT
r=2/4/8) and, on a device, the text base with its TT r=4 fine-tune. Every run is the recipe's own
command (finetune.py / pretrain.py, resumable), then bf16 exports.

    python training/suite.py cpu                       # QM9 one after another, export to checkpoints/, evaluate
    python training/suite.py cpu --steps 1500          # the session-2 budget
    python training/suite.py device --qm9-s 240 --text-s 170 --ft-s 70   # a GPU lease: all side by side
    python training/suite.py device --smoke --base B --runs R   # the test's size: seconds, tiny configs
    python training/suite.py ablation --steps 300 --set threads=2   # the quality levers at one budget
    python training/suite.py ablation --steps 1000 --arms none-r1 tt-r8-marginal tt-r8-marginal3 \
        --runs runs/ablation-1000
    python training/suite.py vadd --base-steps 800 --steps 200 --set threads=2   # VADD, VADD+CP, VADD+TT

``cpu`` writes runs/qm9-* and exports into checkpoints/ (re-run after an interruption: finished runs
resume at their end). ``device`` first probes every run at once (so under the same contention) to
measure its seconds per step, then gives each run the most steps that fit its wall-clock budget,
capped, with its cosine schedule over exactly those steps (the QM9 fine-tunes share one count, set by
the slowest); it writes runs/device/{qm9-*,text-base,text-tt-r4} and bf16 exports in runs/device/export/.
Eager on the device (compile would cost more than it saves in a short lease).
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QM9_SPECS = [("tt", 8), ("none", 1), ("cp", 64), ("tt", 2), ("tt", 4)]
SMOKE_SPECS = [("tt", 2), ("none", 1), ("cp", 3)]
SAMPLE = ROOT / "tests" / "data" / "qm9_sample.txt"
BASE_HINT = ("restore the base of the bundled fine-tunes from git history: "
             "git checkout eb5797a -- checkpoints/qm9-base && mv checkpoints/qm9-base runs/")


def recipe(name: str, *args) -> list[str]:
    return [sys.executable, str(ROOT / "training" / name), *map(str, args)]


def qm9_finetune(args, dec: str, rank: int, out: Path, steps: int, *sets: str) -> list[str]:
    config = ["--config", "tiny", "--data", SAMPLE] if args.smoke else ["--config", "qm9_finetune"]
    return recipe("finetune.py", *config, "--base", args.base, "--decomposition", dec, "--rank", rank,
                  "--head", "1layer", "--out", out, "--max-steps", steps, "--resume", "--quiet",
                  "--set", f"total_steps={steps}", *args.sets, *sets)


def text_recipe(args, name: str, out: Path, steps: int, *extra) -> list[str]:
    config = ["--config", "tiny", "--set", "data=text", "family=text", "bpe_vocab=300", "length=16"] if args.smoke \
        else ["--config", "text" if name == "pretrain.py" else "text_finetune", "--set"]
    joint = ["--decomposition", "tt", "--rank", 2 if args.smoke else 4, "--head", "2layer"] \
        if name == "finetune.py" else []
    return recipe(name, *extra, *joint, "--out", out, "--max-steps", steps, "--resume", "--quiet",
                  *config, f"total_steps={steps}", *args.sets)


def run_all(commands: dict[Path, list[str]]) -> None:
    """Run the commands side by side, each logging to ``<out>.log``; fail if any fails."""
    procs = {}
    for out, cmd in commands.items():
        out.parent.mkdir(parents=True, exist_ok=True)
        procs[out] = subprocess.Popen(cmd, cwd=ROOT, stdout=open(f"{out}.log", "w"), stderr=subprocess.STDOUT)
    failed = [str(out) for out, p in procs.items() if p.wait() != 0]
    if failed:
        raise SystemExit(f"failed: {failed} (see their .log files)")


def fit_steps(budget_s: float, cap: int, runs: list[Path]) -> int:
    """The steps that fit ``budget_s`` at the slowest of the (finished) runs' seconds per step, capped."""
    metas = [json.loads((r / "train_state" / "state.json").read_text()) for r in runs]
    seconds_per_step = max(m["wall_seconds"] / m["step"] for m in metas)
    return max(1, min(cap, int(budget_s / seconds_per_step)))


def export(src: Path, out: Path, family: str) -> None:
    subprocess.run(recipe("export.py", "--src", src, "--out", out, "--family", family), cwd=ROOT, check=True)


def say(message: str) -> None:
    print(f"== {message} ({time.strftime('%H:%M:%S')})", flush=True)


def cpu_suite(args) -> None:
    runs = Path(args.runs or ROOT / "runs")
    specs = SMOKE_SPECS if args.smoke else QM9_SPECS
    for dec, rank in specs:  # one after another: two cores are one run's worth
        say(f"qm9 {dec} r={rank}: {args.steps} steps")
        subprocess.run(qm9_finetune(args, dec, rank, runs / f"qm9-{dec}-r{rank}", args.steps), cwd=ROOT, check=True)
    exports = Path(args.exports or ROOT / "checkpoints")
    for dec, rank in specs:
        export(runs / f"qm9-{dec}-r{rank}", exports / f"qm9-{dec}-r{rank}", "qm9")
    if not args.smoke:
        (ROOT / "results" / "qm9").mkdir(parents=True, exist_ok=True)
        subprocess.run(recipe("evaluate.py", "--checkpoints", exports, "--out", ROOT / "results" / "qm9", "--cards"),
                       cwd=ROOT, check=True)


def ablation_arms(steps: int) -> dict[str, tuple[str, int, tuple[str, ...]]]:
    """The quality levers, each a QM9 fine-tune of the same base at the same budget: name -> (decomposition,
    rank, config overrides). The EMA's decay averages over about the last tenth of the run."""
    decay = min(0.9999, 1 - 10 / steps)
    return {"none-r1": ("none", 1, ()), "tt-r8": ("tt", 8, ()),
            "tt-r8-ema": ("tt", 8, (f"ema_decay={decay:.6g}",)),
            "tt-r8-marginal": ("tt", 8, ("marginal_weight=1.0",)),
            "tt-r8-marginal3": ("tt", 8, ("marginal_weight=3.0",)),
            "tt-r8-head-lr": ("tt", 8, ("head_lr_ratio=0.3",)),
            "tt-r8-freeze": ("tt", 8, (f"freeze_backbone_steps={steps // 3}",))}


def ablation_suite(args) -> None:
    """One run per lever, one after another (resumable), then every run evaluated side by side: random order,
    K = 1, 2, 4, 8, 16, l, TT also with the exact contraction and as its rank-1 view."""
    runs = Path(args.runs or ROOT / "runs" / "ablation")
    arms = ablation_arms(args.steps)
    if args.arms:
        unknown = sorted(set(args.arms) - set(arms))
        if unknown:
            raise SystemExit(f"unknown arms {unknown}; known: {sorted(arms)}")
        arms = {name: arms[name] for name in args.arms}
    if args.smoke:
        arms = {name: (dec, min(rank, 2), sets) for name, (dec, rank, sets) in arms.items()}  # smoke: tiny ranks
    warmup = f"warmup_steps={max(1, args.steps // 10)}"
    for name, (dec, rank, sets) in arms.items():
        say(f"ablation {name}: {args.steps} steps")
        subprocess.run(qm9_finetune(args, dec, rank, runs / name, args.steps, warmup, *sets), cwd=ROOT, check=True)
    evaluate_side_by_side(args, [runs / name for name in arms], Path(args.exports or ROOT / "results" / "ablation"),
                          "--contractions", "head", "exact", "--rank-one-view")


def evaluate_side_by_side(args, checkpoints: list[Path], out: Path, *extra) -> None:
    """evaluate.py on ``checkpoints`` together: random order, K = 1, 2, 4, 8, 16 and l (a token a step)."""
    out.mkdir(parents=True, exist_ok=True)
    length = json.loads((checkpoints[0] / "config.json").read_text())["model"]["dit"]["length"]
    sizes = ("--samples", 16, "--batch", 16, "--data", SAMPLE, "--precision", "fp32") if args.smoke else ()
    subprocess.run(recipe("evaluate.py", "--checkpoints", *checkpoints, "--out", out, "--orderings", "random",
                          "--steps", 1, 2, 4, 8, 16, length, "--eb-gammas", *extra, *sizes), cwd=ROOT, check=True)


def vadd_suite(args) -> None:
    """VADD (Sec. 4.4) on QM9: a VADD base pretrained from scratch (``--base-steps``), then three fine-tunes
    of it at one budget (``--steps``): VADD itself (rank 1), VADD+CP r=64, VADD+TT r=8, each trained with
    Eq. 21; evaluated side by side (random order, K = 1, 2, 4, 8, 16, l)."""
    runs = Path(args.runs or ROOT / "runs" / "vadd")
    config = ["--config", "tiny", "--data", SAMPLE] if args.smoke else ["--config", "qm9"]
    say(f"VADD base: {args.base_steps} steps")
    subprocess.run(recipe("pretrain.py", *config, "--latent", "vadd", "--latent-dim", 8 if args.smoke else 32,
                          "--out", runs / "base", "--max-steps", args.base_steps, "--resume", "--quiet", "--set",
                          f"total_steps={args.base_steps}", f"warmup_steps={max(1, args.base_steps // 10)}",
                          *args.sets), cwd=ROOT, check=True)
    arms = {"vadd": ("none", 1), "vadd-cp-r64": ("cp", 3 if args.smoke else 64),
            "vadd-tt-r8": ("tt", 2 if args.smoke else 8)}
    base, args.base = args.base, runs / "base"
    for name, (dec, rank) in arms.items():
        say(f"{name}: {args.steps} steps")
        warmup = f"warmup_steps={max(1, args.steps // 10)}"
        subprocess.run(qm9_finetune(args, dec, rank, runs / name, args.steps, warmup), cwd=ROOT, check=True)
    args.base = base
    evaluate_side_by_side(args, [runs / name for name in arms], Path(args.exports or ROOT / "results" / "vadd"))


def device_suite(args) -> None:
    r = Path(args.runs or ROOT / "runs" / "device")
    specs = SMOKE_SPECS if args.smoke else QM9_SPECS
    eager = ("compile=false",)
    tokenizer = ("--tokenizer", args.tokenizer) if args.tokenizer else ()
    say(f"probes: {args.probe_steps} steps each, all at once")
    probes = {r / f"probe-qm9-{d}-r{k}": qm9_finetune(args, d, k, r / f"probe-qm9-{d}-r{k}", args.probe_steps, *eager)
              for d, k in specs}
    probes[r / "probe-text"] = text_recipe(args, "pretrain.py", r / "probe-text", args.probe_steps, *tokenizer)
    run_all(probes)
    nq = fit_steps(args.qm9_s, args.qm9_max, [p for p in probes if p.name.startswith("probe-qm9")])
    nt = fit_steps(args.text_s, args.text_max, [r / "probe-text"])
    say(f"QM9 fine-tunes: {nq} steps each; text base: {nt} steps")
    runs = {r / f"qm9-{d}-r{k}": qm9_finetune(args, d, k, r / f"qm9-{d}-r{k}", nq, *eager) for d, k in specs}
    runs[r / "text-base"] = text_recipe(args, "pretrain.py", r / "text-base", nt, *tokenizer)
    runs[r / "probe-text-tt-r4"] = text_recipe(args, "finetune.py", r / "probe-text-tt-r4", args.probe_steps,
                                               "--base", r / "probe-text")
    run_all(runs)  # the text fine-tune's probe runs beside them; the fine-tune itself needs the base
    nf = fit_steps(args.ft_s, args.ft_max, [r / "probe-text-tt-r4"])
    say(f"text TT fine-tune: {nf} steps")
    run_all({r / "text-tt-r4": text_recipe(args, "finetune.py", r / "text-tt-r4", nf, "--base", r / "text-base")})
    say("trained")
    for d, k in specs:
        export(r / f"qm9-{d}-r{k}", r / "export" / f"qm9-{d}-r{k}", "qm9")
    for name in ("text-base", "text-tt-r4"):
        export(r / name, r / "export" / name, "text")
    for card in sorted((r / "export").glob("*/model_card.md")):
        print(card.parent.name, *[line for line in card.read_text().split("\n")
                                  if line.startswith(("- validation", "- steps"))], sep="\n  ")
    say("done")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=["cpu", "device", "ablation", "vadd"])
    ap.add_argument("--base", default=str(ROOT / "runs" / "qm9-base"),
                    help="the QM9 base checkpoint (what the README's pretrain command writes; " + BASE_HINT + ")")
    ap.add_argument("--runs", help="where the runs go (default runs/ for cpu, runs/device/ for device)")
    ap.add_argument("--exports", help="cpu: where the exports go (default checkpoints/); ablation: where the "
                    "results go (default results/ablation/)")
    ap.add_argument("--steps", type=int, default=6362, help="cpu: steps of each fine-tune")
    ap.add_argument("--qm9-s", type=float, default=240, help="device: wall-clock budget of the QM9 fine-tunes")
    ap.add_argument("--text-s", type=float, default=170, help="device: budget of the text base")
    ap.add_argument("--ft-s", type=float, default=70, help="device: budget of the text fine-tune")
    ap.add_argument("--qm9-max", type=int, default=10000)
    ap.add_argument("--text-max", type=int, default=20000)
    ap.add_argument("--ft-max", type=int, default=6000)
    ap.add_argument("--probe-steps", type=int, default=100)
    ap.add_argument("--arms", nargs="*", help="ablation: only these arms (default all)")
    ap.add_argument("--base-steps", type=int, default=1000, help="vadd: steps of the VADD base")
    ap.add_argument("--tokenizer", help="device: keep this checkpoint's text vocabulary")
    ap.add_argument("--set", dest="sets", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides for every run (e.g. threads=1)")
    ap.add_argument("--smoke", action="store_true", help="tiny configs and the committed QM9 sample (the test)")
    args = ap.parse_args()
    for name in ("base", "runs", "exports", "tokenizer"):  # the recipes run in the repository: paths from here
        if getattr(args, name):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    if args.suite != "vadd" and not (Path(args.base) / "config.json").exists():
        ap.error(f"--base {args.base}: no checkpoint there; pretrain it (python training/pretrain.py --config qm9 "
                 f"--out {args.base} --max-minutes 150 --resume) or {BASE_HINT}")
    {"cpu": cpu_suite, "device": device_suite, "ablation": ablation_suite, "vadd": vadd_suite}[args.suite](args)


if __name__ == "__main__":
    main()
