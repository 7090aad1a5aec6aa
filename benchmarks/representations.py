"""What a molecule's representation costs and buys, at an equal budget: SMILES, SELFIES (``data.tokenizer:
selfies``), SAFE (``safe``) and SMILES with randomized-SMILES augmentation (``data.augment``), each a rank-1 MDM
pretrained with the same recipe and steps, then sampled at K steps (random order) and measured: validity,
uniqueness, novelty, GenMol's quality (valid, unique, QED >= 0.6, SA <= 4; all as % of samples but uniqueness
and novelty, which are % of the valid), FCD to the held-out split, the sequence length in tokens, and the
samples RDKit reads but that are several disconnected fragments (% of samples: not valid, since no QM9
molecule is; SAFE writes them when an attachment digit goes unpaired).
FCD is computed on ``--fcd-valid`` valid samples for every cell (more batches are drawn, other seeds, until that
many are valid, at most 20x ``--samples``): FCD falls with the number of molecules it is computed on, so rows
whose validity differs compare only at an equal count (the cell says how many it used).

    python benchmarks/representations.py --out runs/representations               # QM9, about 20 minutes on 2 cores
    python benchmarks/representations.py --smoke --out DIR                         # the tests: seconds

Each run is ``training/pretrain.py --config tiny`` at a larger width (``--hidden``) with ``--steps`` steps and the
representation's ``--set``; the table is printed as it fills.
"""

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"SMILES": [], "SELFIES": ["data.tokenizer=selfies"], "SAFE": ["data.tokenizer=safe"],
            "SMILES + 4 randomized": ["data.augment=4"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="qm9")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--k", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--out", default="runs/representations")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", nargs="*", help="only these representations (names as in the table)")
    ap.add_argument("--fcd-valid", type=int, default=1000, help="the valid samples FCD is computed on")
    args = ap.parse_args()
    if args.smoke:
        args.data, args.steps, args.hidden, args.samples, args.k, args.fcd_valid = (
            str(ROOT / "tests" / "data" / "qm9_sample.txt"), 2, 32, 16, [4], 4)
    from ttcore.data import load_dataset
    from ttcore.data.qm9 import default_cache_dir
    from ttcore.metrics import canonical, molecule_metrics
    from ttcore.metrics.distribution import Reference
    from ttcore.models import load_for_inference
    from ttcore.recipes import load_config
    from ttcore.sampling import generate

    out = Path(args.out)
    print(f"{args.data}: rank-1 MDMs, width {args.hidden}, {args.steps} steps each, {args.samples} samples per "
          "cell, random order, seed 0")
    base = ["data.source=" + args.data]
    held_out = next(iter(load_dataset(load_config(ROOT / "training" / "configs" / "tiny.yaml", base).data)
                         .references.values()))  # SMILES, whatever a run's representation
    reference = Reference.cached(held_out, default_cache_dir() / "references")
    print(f"FCD against the {len(reference.smiles)} held-out molecules, on {args.fcd_valid} valid samples per cell")
    print("| representation | tokens (l) | K | valid % | unique % | novel % | quality % | FCD (valid used) "
          "| fragments % |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, overrides in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        run = out / name.split()[0].lower() if "+" not in name else out / "smiles-augmented"
        settings = [f"data.source={args.data}", f"model.hidden_dim={args.hidden}", "model.n_blocks=4",
                    "model.n_heads=4", "model.cond_dim=64", "batch_size=64", f"total_steps={args.steps}", "threads=2",
                    "val_every=1000000", *overrides]
        done = subprocess.run([sys.executable, str(ROOT / "training" / "pretrain.py"), "--config", "tiny", "--out",
                               str(run), "--max-steps", str(args.steps), "--resume", "--quiet", "--set", *settings],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name}: pretrain failed\n{done.stderr[-3000:]}")
        model, tok, _ = load_for_inference(run, "cpu", "bf16")
        training = set(load_dataset(load_config(ROOT / "training" / "configs" / "tiny.yaml", settings).data).train)
        for k in args.k:
            draws = []
            for seed in range(20):  # the first batch is the table's; the rest only until FCD has its molecules
                with model.compute_context():
                    *_, last = generate(model, args.samples, k, seed=seed)
                draws.append([tok.decode(r) for r in last.tokens.tolist()])
                valid = [c for batch in draws for c in (canonical(x, one_molecule=True) for x in batch)
                         if c is not None][: args.fcd_valid]  # valid as the validity column counts it
                if len(valid) >= args.fcd_valid:
                    break
            m = molecule_metrics(draws[0], training)
            parsed = molecule_metrics(draws[0], training, one_molecule=False)["validity"]  # fragments counted
            fcd = reference.compare(valid)["fcd"]
            print(f"| {name} | {tok.length} | {k} | {100 * m['validity']:.1f} | {100 * m['uniqueness']:.1f} | "
                  f"{100 * m['novelty']:.1f} | {100 * m['quality']:.1f} | "
                  f"{'-' if fcd is None else f'{fcd:.2f}'} ({len(valid)}) | {100 * (parsed - m['validity']):.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
