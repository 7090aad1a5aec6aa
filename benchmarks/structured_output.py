"""Structured output (``regex`` / ``grammar``): what a constrained step costs, side by side with the same run
unconstrained, and what the SMILES grammar does for the served QM9 TT through HTTP.

    python benchmarks/structured_output.py speed      # QM9 TT r = 16, block TT: the grammar; text TT: a regex
    python benchmarks/structured_output.py quality    # QM9 TT r = 16 over HTTP, K = 4 and 8, 1,024 molecules a cell
    python benchmarks/structured_output.py speed --checkpoints DIR --samples 2 --steps 2 --repeats 1     # smoke
    python benchmarks/structured_output.py quality --checkpoints DIR --checkpoint qm9-tt-r16 qm9-tt-r16-d2 \
        --steps 1 2 4 8                                   # a teacher and its distilled students, by their names
    python benchmarks/structured_output.py quality --checkpoints DIR --samples 8 --steps 2 \
        --checkpoint qm9-tt-r2 qm9-cp-r3                                                                # smoke
    python benchmarks/structured_output.py violations # 20 regexes on text, the grammar on QM9 and MOSES
    python benchmarks/structured_output.py violations --checkpoints DIR --samples 2 --steps 2             # smoke

``speed`` runs, in process, a whole generation of ``--samples`` sequences at ``--steps`` steps (a block model at its
own default, one step a block: ``K``) with and without the constraint, alternating ``--repeats`` times, and prints
the median seconds per step of each and their ratio (constrained / free), with the automaton's states and token
classes. ``quality`` serves the checkpoints on an
embedded server (uvicorn, one thread: ``served_overhead``'s) and asks ``/generate`` for ``--samples`` molecules
a cell (random order) of each ``--checkpoint`` (a name in ``GET /models``), with and without ``grammar: smiles``:
validity (one molecule), uniqueness, novelty, FCD to QM9's held-out split, and of the invalid molecules the share
RDKit rejects for each reason (parse, valence, aromaticity, other): a regular language can remove parse errors
only, and not all of them (``_why_invalid``).
``violations`` samples, in process, ``--samples`` sequences per regex of ``REGEXES`` on each text checkpoint and
per grammar on each SMILES checkpoint, and counts the samples outside their language (each checked by Python's
``re.fullmatch`` on the decoded text, or by the grammar's automaton on the tokens).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "training"))
from served_overhead import _start as start_server  # noqa: E402 (benchmarks/ is this script's own path)

TEXT_REGEX = r"[A-Z][a-z]{1,12}( [a-z]{1,12}){0,4}, [0-9]{4}\."  # a 64-state automaton over the text tokens


def _automaton(name: str, tok):
    from service.constraints import Constraints

    if tok.kind == "smiles":
        return "grammar smiles", Constraints(tok).of(None, "smiles", None)
    return f"regex {TEXT_REGEX}", Constraints(tok).of(TEXT_REGEX, None, None)


REGEXES = [r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[A-Z][a-z]+", r"(yes|no)", r"[a-z]+( [a-z]+){0,3}\.",
           r"[0-9]+(\.[0-9]{1,2})?", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)",
           r"The [a-z]+ of [A-Z][a-z]+\.", r"[A-Z]{2,4}", r"[a-z ]{10,40}", r"#[0-9a-f]{6}",
           r"(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day", r"[0-9]{1,2}:[0-9]{2} (am|pm)", r"\{\"a\": [0-9]+\}",
           r"[a-z]+, [a-z]+ and [a-z]+", r"v[0-9]+\.[0-9]+\.[0-9]+", r"(the|a|an) [a-z]+",
           r"[A-Z][a-z]+ [A-Z][a-z]+", r"-?[0-9]{1,5}", r"[a-z]+ing"]  # 20: dates, words, JSON-ish, numbers


def violations(args) -> None:
    import re

    from service.constraints import Constraints
    from ttcore.models import load_for_inference
    from ttcore.sampling import GenerationRun, batch_step

    print(f"{'checkpoint':>14} | {'constraint':<44} | {'samples':>7} | {'violations':>10} | {'s':>6}")
    for path in args.paths:
        model, tok, _ = load_for_inference(path, "cpu", args.precision)
        if tok.kind == "smiles":
            cases = [("grammar smiles", None, "smiles")]
        else:
            cases = [(f"regex {r}", r, None) for r in REGEXES]
        for label, regex, grammar in cases:
            dfa = Constraints(tok).of(regex, grammar, None)
            t0, bad, n = time.perf_counter(), 0, 0
            for seed in range(0, args.samples, 64):
                run = GenerationRun(model, min(64, args.samples - seed), args.steps, seed=seed, constraint=dfa)
                with model.compute_context():
                    while not run.done:
                        batch_step(model, [run])
                for row in run.tokens:
                    ok = dfa.accepts(row.tolist()) if grammar else re.fullmatch(regex, tok.decode(row.tolist()))
                    bad, n = bad + (not ok), n + 1
            print(f"{path.name:>14} | {label[:44]:<44} | {n:>7} | {bad:>10} | {time.perf_counter() - t0:>6.1f}",
                  flush=True)


def _run_seconds(model, n: int, steps: int, constraint) -> float:
    from ttcore.sampling import GenerationRun, SamplerConfig, batch_step

    config = SamplerConfig(**model.cfg.kind.request_defaults(model.cfg))  # a block model's: `sampler: blocks`
    run = GenerationRun(model, n, steps, config, seed=0, constraint=constraint)
    t0 = time.perf_counter()
    with model.compute_context():
        while not run.done:
            batch_step(model, [run])
    return time.perf_counter() - t0


def speed(args) -> None:
    from ttcore.models import load_for_inference

    print(f"{'checkpoint':>14} | {'constraint':<44} | {'states':>6} {'classes':>7} | {'K':>3} | {'free s/step':>11} "
          f"{'constrained':>11} | {'ratio':>6}")
    for path in args.paths:
        model, tok, _ = load_for_inference(path, "cpu", args.precision)
        steps = model.cfg.kind.default_steps(model.cfg) or args.steps  # a block model: one step a block
        label, dfa = _automaton(path.name, tok)
        _run_seconds(model, 1, steps, None), _run_seconds(model, 1, steps, dfa)  # warm-up
        free, bound = [], []
        for _ in range(args.repeats):  # alternating: load moves both alike
            free.append(_run_seconds(model, args.samples, steps, None) / steps)
            bound.append(_run_seconds(model, args.samples, steps, dfa) / steps)
        f, b = statistics.median(free), statistics.median(bound)
        print(f"{path.name:>14} | {label[:44]:<44} | {dfa.num_states:>6} {dfa.classes[1].shape[1]:>7} | {steps:>3} | "
              f"{f:>11.4f} {b:>11.4f} | {b / f:>5.2f}x")


def _why_invalid(smiles: str) -> str:
    """RDKit's reason for rejecting a SMILES string: parse (it does not parse: with the grammar, what is left is
    a ring closed onto an atom already bonded to the opener, a duplicate bond the grammar does not track), valence,
    aromaticity (kekulize), fragments (parses and sanitizes, but is several molecules) or other."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles, sanitize=False)
    if mol is None:
        return "parse"
    try:
        Chem.SanitizeMol(mol)
    except Chem.AtomValenceException:
        return "valence"
    except Chem.KekulizeException:
        return "aromaticity"
    except Exception:  # noqa: BLE001 (RDKit's other sanitization errors)
        return "other"
    return "fragments" if len(Chem.GetMolFrags(mol)) > 1 else "valid"


def quality(args) -> None:
    from _common import dataset

    from ttcore.metrics import molecule_metrics
    from ttcore.metrics.distribution import Reference
    from ttcore.recipes import TrainConfig

    ds = dataset(TrainConfig())  # QM9: the training split for novelty, the held-out split for FCD
    training = set(ds.train)
    reference = Reference(next(iter(ds.references.values())), "cpu")
    proc, url = start_server(ROOT, args.checkpoints, "auto")  # served_overhead's: the embedded server, ready
    print(f"{'checkpoint':>16} | {'K':>3} | {'grammar':>7} | {'valid %':>7} {'unique %':>8} {'novel %':>7} "
          f"{'FCD':>6} | invalid: {'parse':>6} {'valence':>7} {'aromatic':>8} {'other':>5} | {'s':>5}")
    try:
        checkpoints = args.checkpoint or [next(m["checkpoint"] for m in httpx.get(url + "/models").json()["models"]
                                               if m["model"] == "qm9" and m["decomposition"] == "tt")]
        for checkpoint, k, grammar in ((c, k, g) for c in checkpoints for k in args.steps for g in (None, "smiles")):
            texts, t0, batch = [], time.perf_counter(), min(args.samples, 256)
            for seed in range(0, args.samples, batch):
                body = {"checkpoint": checkpoint, "num_samples": batch, "steps": k, "seed": seed,
                        "timeout_s": 600, **({"grammar": grammar} if grammar else {})}
                r = httpx.post(url + "/generate", json=body, timeout=900)
                if r.status_code != 200:
                    raise SystemExit(f"{body}: {r.status_code} {r.text[:300]}")
                texts += [s["text"] for s in r.json()["samples"]]
            seconds = time.perf_counter() - t0
            m = molecule_metrics(texts, training)
            fcd = reference.compare(texts)["fcd"]
            why = [_why_invalid(t) for t in texts]
            bad = [w for w in why if w != "valid"]

            def share(reason, bad=bad):
                return f"{100 * bad.count(reason) / max(1, len(bad)):.0f}%"
            print(f"{checkpoint:>16} | {k:>3} | {grammar or '-':>7} | {100 * m['validity']:>7.1f} "
                  f"{100 * m['uniqueness']:>8.1f} {100 * m['novelty']:>7.1f} "
                  f"{'-' if fcd is None else f'{fcd:.3f}':>6} | {len(bad):>5} of {len(texts)}: "
                  f"{share('parse'):>6} {share('valence'):>7} {share('aromaticity'):>8} "
                  f"{share('other'):>5} | {seconds:>5.1f}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _checkpoints(root: Path, names: tuple[str, ...]) -> list[Path]:
    """The bundled checkpoints a part measures, or every loadable one under ``root`` when none is there."""
    found = [root / n for n in names if (root / n).is_dir()]
    return found or sorted(p for p in root.iterdir() if (p / "config.json").is_file() and p.name != "broken")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["speed", "quality", "violations"])
    ap.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--checkpoint", nargs="*", default=[],
                    help="quality: the checkpoints to ask for, by their names in GET /models (default: the first QM9 "
                         "TT)")
    ap.add_argument("--samples", type=int, help="speed: sequences a run (64); quality: molecules a cell (1024); "
                                                "violations: samples a constraint (500)")
    ap.add_argument("--steps", type=int, nargs="*", help="speed: steps a run (4); quality: K values (4 8)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--precision", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.part == "speed":
        args.paths = _checkpoints(args.checkpoints, ("qm9-tt-r16", "qm9-b2-tt-r8", "text-tt-r4"))
        args.samples = args.samples or 64
        args.steps = (args.steps or [4])[0]
        speed(args)
    elif args.part == "violations":
        args.paths = _checkpoints(args.checkpoints, ("qm9-tt-r16", "moses-tt-r8", "text-tt-r4"))
        args.samples = args.samples or 500
        args.steps = (args.steps or [4])[0]
        violations(args)
    else:
        args.samples = args.samples or 1024
        args.steps = args.steps or [4, 8]
        quality(args)


if __name__ == "__main__":
    main()
