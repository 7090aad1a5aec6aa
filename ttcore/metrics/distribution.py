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

from collections import Counter

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


def internal_diversity(fps: list) -> float:
    """IntDiv_1: 1 - mean Tanimoto similarity over all ordered pairs (self-pairs included, as MOSES)."""
    total = sum(sum(DataStructs.BulkTanimotoSimilarity(fp, fps)) for fp in fps)
    return 1.0 - total / len(fps) ** 2


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
    samples not in ``training``, canonical SMILES, over the distinct valid samples)."""
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
    """Cosine of the two count vectors over the union of their keys (0 if either is empty)."""
    keys = list(set(a) | set(b))
    u, v = np.array([a.get(k, 0) for k in keys], float), np.array([b.get(k, 0) for k in keys], float)
    norm = np.linalg.norm(u) * np.linalg.norm(v)
    return float(u @ v / norm) if norm > 0 else 0.0


class Reference:
    """A reference set (e.g. QM9's held-out split) with what every comparison needs computed once: its
    canonical SMILES, fingerprints, fragment and scaffold counts, and ChemNet's activation statistics."""

    def __init__(self, smiles: list[str], device: str = "cpu"):
        import fcd

        self.smiles = [c for c in map(canonical, smiles) if c is not None]
        self.fps = fingerprints(self.smiles)
        self.fragments, self.scaffolds = fragments(self.smiles), scaffolds(self.smiles)
        self.device, self.chemnet = device, fcd.load_ref_model()
        self.mu, self.sigma = self._activation_stats(self.smiles)

    def _activation_stats(self, smiles: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import fcd

        act = fcd.get_predictions(self.chemnet, smiles, device=self.device)
        return act.mean(0), np.cov(act.T)

    def compare(self, generated: list[str]) -> dict:
        """The metrics of the module docstring for ``generated`` (any strings; the invalid are dropped), and
        ``n_valid``, the molecules they were computed on. Empty metrics are None."""
        import fcd

        valid = [c for c in map(canonical, generated) if c is not None]
        if len(valid) < 2:
            return {"n_valid": len(valid), "fcd": None, "snn": None, "frag": None, "scaf": None, "int_div": None}
        fps = fingerprints(valid)
        mu, sigma = self._activation_stats(valid)
        return {"n_valid": len(valid),
                "fcd": float(fcd.utils.calculate_frechet_distance(mu, sigma, self.mu, self.sigma)),
                "snn": nearest_neighbour_similarity(fps, self.fps),
                "frag": cosine_similarity(fragments(valid), self.fragments),
                "scaf": cosine_similarity(scaffolds(valid), self.scaffolds),
                "int_div": internal_diversity(fps)}
