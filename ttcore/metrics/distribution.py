"""MOSES-style distribution metrics of generated molecules against a reference set (Polykovskiy et al. 2020,
"Molecular Sets (MOSES)", Sec. 3): how close the generated distribution is to the data's, beyond validity.

Each follows MOSES's definition, computed on the *valid* generated molecules (canonical SMILES):
- ``fcd``: Frechet ChemNet Distance (Preuer et al. 2018) between the ChemNet activations of the two sets
  (the ``fcd`` package, which bundles ChemNet's weights); lower is closer;
- ``snn``: mean over generated molecules of the Tanimoto similarity to the nearest reference molecule
  (Morgan fingerprints, radius 2, 1024 bits);
- ``frag``: cosine similarity of the BRICS-fragment count vectors of the two sets (each molecule cut on
  its BRICS bonds, every fragment counted, as often as it occurs);
- ``scaf``: cosine similarity of the Bemis-Murcko scaffold count vectors (scaffolds with at least two
  rings: MOSES's ``min_rings=2``);
- ``int_div``: 1 - the mean Tanimoto similarity over all ordered pairs of generated molecules, pairs of a
  molecule with itself included (MOSES's IntDiv_1).

And MOSES's counting metrics (``moses_counts``): ``unique@k``, distinct canonical SMILES among the first k
valid samples; ``novelty``, the share of the *distinct* valid samples not in the training set (QM9's rows
use MDLM's novelty instead: valid samples, repeats counted, ``ttcore.metrics.molecules``).

Checked against molsets 0.3.1's own code on shared molecule sets (FCD through its ``fcd_torch``):
``tests/metrics/test_moses_definitions.py``.
"""

import functools
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
from rdkit import Chem, DataStructs
from rdkit.Chem import rdFingerprintGenerator
from rdkit.Chem.Scaffolds import MurckoScaffold

from .molecules import canonical

MORGAN = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=1024)


def fingerprints(smiles: list[str]) -> list:
    return [MORGAN.GetFingerprint(Chem.MolFromSmiles(s)) for s in smiles]


def nearest_neighbour_similarity(gen_fps: list, ref_fps: list) -> float:
    """SNN: mean over ``gen_fps`` of the largest Tanimoto similarity to any of ``ref_fps``."""
    return float(np.mean([max(DataStructs.BulkTanimotoSimilarity(fp, ref_fps)) for fp in gen_fps]))


def internal_diversity(fps: list, p: int = 1) -> float:
    """IntDiv_p: 1 - the mean over molecules of the power mean (order p) of their Tanimoto similarities to every
    molecule of the set, themselves included (MOSES's IntDiv_1 and IntDiv_2); p = 1 is 1 - the mean over all
    ordered pairs."""
    per_molecule = [np.mean(np.asarray(DataStructs.BulkTanimotoSimilarity(fp, fps)) ** p) ** (1 / p) for fp in fps]
    return 1.0 - float(np.mean(per_molecule))


def fragments(smiles: list[str]) -> Counter:
    """The fragments of each molecule cut on its BRICS bonds (canonical SMILES with the bond labels as dummy
    atoms), every occurrence counted over the set."""
    counts = Counter()
    for s in smiles:
        counts.update(Chem.MolToSmiles(Chem.FragmentOnBRICSBonds(Chem.MolFromSmiles(s))).split("."))
    return counts


def scaffold(smiles: str, min_rings: int = 2) -> str | None:
    """The Bemis-Murcko scaffold's canonical SMILES, or None when it has fewer than ``min_rings`` rings."""
    try:
        mol = MurckoScaffold.GetScaffoldForMol(Chem.MolFromSmiles(smiles))
    except (ValueError, RuntimeError):
        return None
    out = Chem.MolToSmiles(mol)
    return out if out and mol.GetRingInfo().NumRings() >= min_rings else None


def scaffolds(smiles: list[str], min_rings: int = 2) -> Counter:
    """Scaffolds of at least ``min_rings`` rings, counted over the set."""
    counts = Counter(scaffold(s, min_rings) for s in smiles)
    counts.pop(None, None)
    return counts


def moses_counts(generated: list[str], training: set[str], ks: tuple[int, ...] = (1000, 10000)) -> dict:
    """MOSES's ``valid``, ``unique@k`` (for each k not above the valid count) and ``novelty`` (distinct valid
    samples not in ``training``, canonical SMILES, over the distinct valid samples). Valid as MOSES counts it
    (``fraction_valid``: RDKit reads it; several fragments count), so the column compares with MOSES's
    published tables."""
    canon = [canonical(s) for s in generated]
    valid = [c for c in canon if c is not None]
    out = {"valid": len(valid) / max(1, len(generated))}
    for k in ks:
        if len(valid) >= k:
            out[f"unique@{k}"] = len(set(valid[:k])) / k
    distinct = set(valid)
    out["novelty"] = len(distinct - training) / max(1, len(distinct))
    return out


def cosine_similarity(a: dict, b: dict) -> float:
    """Cosine of the two count vectors over the union of their keys; NaN if either is empty (MOSES's
    ``cos_similarity``: a sample set without a scaffold has no Scaf, not a Scaf of 0)."""
    if not a or not b:
        return float("nan")
    keys = list(set(a) | set(b))
    u, v = np.array([a.get(k, 0) for k in keys], float), np.array([b.get(k, 0) for k in keys], float)
    norm = np.linalg.norm(u) * np.linalg.norm(v)
    return float(u @ v / norm) if norm > 0 else float("nan")


@functools.cache
def chemnet():
    """ChemNet (the ``fcd`` package's bundled weights), loaded once per process."""
    import fcd

    return fcd.load_ref_model()


class Reference:
    """A set of molecules with what every comparison needs computed once: its canonical SMILES (the valid ones,
    repeats kept), fingerprints, fragment and scaffold counts, ChemNet's activation statistics (two molecules
    or more) and, when asked, its internal diversity. A held-out set is one; so is a set of samples
    (``compare`` takes either, so samples compared with several references are described once)."""

    def __init__(self, smiles: list[str], device: str = "cpu"):
        self.device = device
        self.smiles = self.canonical_valid(smiles)
        self.fps = fingerprints(self.smiles)
        self.fragments, self.scaffolds = fragments(self.smiles), scaffolds(self.smiles)
        self.mu, self.sigma = self._activation_stats(self.smiles) if len(self.smiles) >= 2 else (None, None)

    @functools.cached_property
    def int_div(self) -> float:
        """IntDiv_1 of the set (``internal_diversity``; quadratic in its size, so computed once)."""
        return internal_diversity(self.fps)

    @classmethod
    def cached(cls, smiles: list[str], cache_dir: str | Path, device: str = "cpu") -> "Reference":
        """The reference of ``smiles``, from ``cache_dir`` when computed before (a large set such as MOSES's
        176k test molecules takes minutes): fingerprints as RDKit's binary form, counts as JSON, ChemNet's
        statistics as arrays; no pickle. Keyed by the molecules and RDKit's version; written atomically."""
        import rdkit

        key = hashlib.sha1("\n".join([f"v1 rdkit {rdkit.__version__}", *smiles]).encode()).hexdigest()[:16]
        arrays, counts = Path(cache_dir) / f"reference-{key}.npz", Path(cache_dir) / f"reference-{key}.json"
        if arrays.exists() and counts.exists():
            ref = cls.__new__(cls)
            with np.load(arrays) as z:
                blob, ends = z["fps"].tobytes(), z["fp_ends"]
                ref.fps = [DataStructs.ExplicitBitVect(blob[a:b]) for a, b in zip(np.r_[0, ends[:-1]], ends)]
                ref.mu, ref.sigma = z["mu"], z["sigma"]
            d = json.loads(counts.read_text())
            ref.device, ref.smiles = device, d["smiles"]
            ref.fragments, ref.scaffolds = Counter(d["fragments"]), Counter(d["scaffolds"])
            return ref
        ref = cls(smiles, device)
        arrays.parent.mkdir(parents=True, exist_ok=True)
        binary = [fp.ToBinary() for fp in ref.fps]
        tmp = arrays.with_name(f".{arrays.stem}.tmp{os.getpid()}.npz")
        np.savez(tmp, mu=ref.mu, sigma=ref.sigma, fps=np.frombuffer(b"".join(binary), np.uint8),
                 fp_ends=np.cumsum([len(b) for b in binary]))
        os.replace(tmp, arrays)
        tmp = counts.with_name(f".{counts.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"smiles": ref.smiles, "fragments": ref.fragments, "scaffolds": ref.scaffolds}))
        os.replace(tmp, counts)
        return ref

    def _activation_stats(self, smiles: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import fcd

        act = fcd.get_predictions(chemnet(), smiles, device=self.device)
        return act.mean(0), np.cov(act.T)

    @staticmethod
    def canonical_valid(generated: list[str]) -> list[str]:
        """The canonical SMILES of the valid samples, repeats kept (what every metric here is computed on)."""
        return [c for c in map(canonical, generated) if c is not None]

    def compare(self, generated: "list[str] | Reference") -> dict:
        """The metrics of the module docstring for ``generated`` (any strings, the invalid dropped; or a set
        already described as a ``Reference``), and ``n_valid``, the molecules they were computed on. Empty
        metrics are None."""
        import fcd

        gen = generated if isinstance(generated, Reference) else Reference(generated, self.device)
        if len(gen.smiles) < 2:
            return {"n_valid": len(gen.smiles), "fcd": None, "snn": None, "frag": None, "scaf": None,
                    "int_div": None}
        return {"n_valid": len(gen.smiles),
                "fcd": float(fcd.utils.calculate_frechet_distance(gen.mu, gen.sigma, self.mu, self.sigma)),
                "snn": nearest_neighbour_similarity(gen.fps, self.fps),
                "frag": cosine_similarity(gen.fragments, self.fragments),
                "scaf": cosine_similarity(gen.scaffolds, self.scaffolds),
                "int_div": gen.int_div}
