"""A pretrained masked LM as the backbone (``ttcore.models.hf``): its cost against the native DiT, and what a TT
head buys on it at few steps.

    python benchmarks/hf_adapter.py --overhead                # forward time per step, ESM-style vs DiT, same size
    python benchmarks/hf_adapter.py --table --out runs/hf-table   # the few-step table (about 15 minutes, 2 cores)
    python benchmarks/hf_adapter.py --overhead --table --smoke --out DIR   # the smallest size (the tests run it)

``--overhead``: a DiT and an ESM-style masked LM (``transformers``' ``EsmForMaskedLM``, rotary positions) of the
same width, depth, heads and MLP ratio, forward pass of a batch at length l (``features``, what one denoising
step computes before its head), best of ``--reps``, side by side in one run, fp32 and bf16 autocast.

``--table``: an ESM-style model pretrained here (the MDLM loss at all masking rates from a random init:
``finetune.py --base ESM --decomposition none``) on the peptides of docs/own-data.md, then fine-tuned at an equal
budget into TT r = 4 and, as the baseline, further as rank 1 (the recipes' own commands). Each samples
``--samples`` peptides at K = 4, 8, 16 (random order); a sample is valid when the peptides' grammar can produce
it (``grammatical``: a start of G/F/M/A, any residue, a core whose every third residue is one of GSEKD and the
others LIVFAKR, an end of KK / R / KR / DE), which needs the positions to agree with each other: what the
factorized draw gets wrong at few steps.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from ttcore.data.peptides import grammatical, peptides

ROOT = Path(__file__).resolve().parents[1]
STEPS = (4, 8, 16)


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


@torch.no_grad()
def overhead(hidden: int, layers: int, heads: int, length: int, batch: int, reps: int, tmp: Path) -> list[str]:
    """Forward seconds of the DiT and the adapted ESM-style model of the same size, side by side."""
    from ttcore.models import DiTConfig, JointModel, ModelConfig
    from ttcore.models.hf import load_masked_lm
    from ttcore.models.hf_random import write_random_masked_lm

    esm, tok = load_masked_lm(write_random_masked_lm("esm", tmp / "esm-overhead", hidden, layers, heads), length)
    dit = JointModel(ModelConfig(DiTConfig(vocab_size=tok.vocab_size + 1, out_vocab=tok.vocab_size, length=length,
                                           hidden_dim=hidden, cond_dim=128, n_blocks=layers, n_heads=heads)))
    x = torch.randint(0, tok.vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))
    rows = []
    for precision in ("fp32", "bf16"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            times = {}
            for name, model in (("DiT", dit.eval()), ("ESM-style", esm.eval())):
                model.features(x)  # warm-up
                times[name] = _best(lambda m=model: m.features(x), reps)
        params = {n: sum(p.numel() for p in m.backbone.parameters()) / 1e6 for n, m in (("DiT", dit), ("ESM", esm))}
        rows.append(f"{precision:>5} | DiT {1e3 * times['DiT']:8.2f} ms ({params['DiT']:.2f}M) | ESM-style "
                    f"{1e3 * times['ESM-style']:8.2f} ms ({params['ESM']:.2f}M) | ratio "
                    f"{times['ESM-style'] / times['DiT']:.2f}x")
    return rows


def _run(argv: list, cwd: Path) -> None:
    done = subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} failed:\n{done.stderr[-3000:]}")


def table(out: Path, hidden: int, layers: int, heads: int, pretrain: int, finetune: int, samples: int,
          n_train: int) -> list[str]:
    """Pretrain, fine-tune (TT r = 4 and rank 1 at an equal budget) with the recipes, then sample and score."""
    from ttcore.models import load_for_inference
    from ttcore.models.hf_random import write_random_masked_lm
    from ttcore.sampling import generate

    out.mkdir(parents=True, exist_ok=True)
    (out / "peptides.txt").write_text("\n".join(peptides(n_train)) + "\n")
    base = write_random_masked_lm("esm", out / "esm-random", hidden, layers, heads, spread=0.0)
    recipe = [ROOT / "training" / "finetune.py", "--config", ROOT / "training" / "configs" / "hf_finetune.yaml",
              "--quiet", "--set", "lr=1e-3", "head_lr_ratio=1", "precision=fp32", "threads=2"]
    _run([*recipe, "--base", base, "--decomposition", "none", "--out", "pretrained", "--max-steps", pretrain], out)
    for name, args in (("tt-r4", ["--decomposition", "tt", "--rank", "4"]), ("rank1", ["--decomposition", "none"])):
        _run([*recipe, "--base", "pretrained", *args, "--out", name, "--max-steps", finetune], out)
    rows = []
    for name in ("rank1", "tt-r4"):
        model, tok, _ = load_for_inference(out / name, "cpu", "fp32")
        val = json.loads((out / name / "train_state" / "state.json").read_text())["val"]
        cells = []
        for k in STEPS:
            with model.compute_context():
                *_, last = generate(model, samples, k, seed=0)
            texts = [tok.decode(row) for row in last.tokens.tolist()]
            cells.append(f"{100 * sum(map(grammatical, texts)) / len(texts):5.1f}%")
        rows.append(f"| {name:>6} | {val['nll']:.3f} | " + " | ".join(cells) + " |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="the smallest size: seconds")
    ap.add_argument("--out", default="runs/hf-adapter")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.overhead:
        size = dict(hidden=32, layers=1, heads=2, length=16, batch=4) if args.smoke else \
            dict(hidden=256, layers=6, heads=8, length=32, batch=64)
        print(f"\nforward per step, batch {size['batch']} x l {size['length']}, width {size['hidden']}, "
              f"{size['layers']} layers, {size['heads']} heads (best of {args.reps}):")
        for row in overhead(**size, reps=args.reps, tmp=out):
            print(row)
    if args.table:
        size = dict(hidden=32, layers=1, heads=2, pretrain=2, finetune=2, samples=16, n_train=300) if args.smoke \
            else dict(hidden=128, layers=4, heads=4, pretrain=1500, finetune=500, samples=512, n_train=4000)
        print(f"\nfew-step table: ESM-style {size['hidden']} x {size['layers']} pretrained {size['pretrain']} "
              f"steps, fine-tuned {size['finetune']}; {size['samples']} samples per cell, random order")
        print("| model  | val NLL | " + " | ".join(f"K = {k}" for k in STEPS) + " |")
        print("|---|---|" + "---|" * len(STEPS))
        for row in table(out, **size):
            print(row)


if __name__ == "__main__":
    main()
