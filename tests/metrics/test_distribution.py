"""MOSES-style distribution metrics against hand computations on tiny sets."""

import math

import pytest
from rdkit import DataStructs

from ttcore.metrics.distribution import (
    Reference,
    cosine_similarity,
    fingerprints,
    internal_diversity,
    nearest_neighbour_similarity,
    scaffolds,
)

MOLS = ["CCO", "c1ccccc1C", "C1CC1CN", "CC(=O)O", "c1ccc2ccccc2c1C"]


def _tanimoto(a: str, b: str) -> float:
    fa, fb = fingerprints([a, b])
    return DataStructs.TanimotoSimilarity(fa, fb)


def test_internal_diversity_averages_every_ordered_pair_with_self_pairs():
    a, b = "CCO", "c1ccccc1C"
    assert internal_diversity(fingerprints([a, a, a])) == pytest.approx(0.0)
    assert internal_diversity(fingerprints([a, b])) == pytest.approx(1 - (2 + 2 * _tanimoto(a, b)) / 4)


def test_nearest_neighbour_similarity_takes_the_best_reference_per_molecule():
    gen, ref = ["CCO", "C1CC1CN"], ["CCN", "CCO", "C1CC1C"]
    expected = sum(max(_tanimoto(g, r) for r in ref) for g in gen) / 2
    assert nearest_neighbour_similarity(fingerprints(gen), fingerprints(ref)) == pytest.approx(expected)
    assert nearest_neighbour_similarity(fingerprints(MOLS), fingerprints(MOLS)) == pytest.approx(1.0)


def test_scaffold_counts_and_their_cosine():
    counts = scaffolds(["c1ccc2ccccc2c1C", "c1ccc2ccccc2c1CC", "c1ccccc1C", "CCO", "C1CC1C1CC1N"])
    assert counts == {"c1ccc2ccccc2c1": 2, "C1CC1C1CC1": 1}  # MOSES counts scaffolds of two rings or more
    assert scaffolds(["c1ccccc1C", "CCO", "C1CC1CN"], min_rings=1) == {"c1ccccc1": 1, "C1CC1": 1}
    other = {"c1ccc2ccccc2c1": 1, "C1CCC1": 3}
    assert cosine_similarity(counts, other) == pytest.approx(2 / (math.sqrt(5) * math.sqrt(10)))
    assert math.isnan(cosine_similarity(counts, {})) and math.isnan(cosine_similarity({}, {}))  # as MOSES


@pytest.mark.slow
def test_a_set_is_closest_to_itself_and_invalid_strings_are_dropped():
    ref = Reference(MOLS)
    same = ref.compare(MOLS + ["C1CC", "not smiles"])
    assert same["n_valid"] == 5 and same["snn"] == pytest.approx(1.0) and same["frag"] == pytest.approx(1.0)
    assert same["scaf"] == pytest.approx(1.0) and abs(same["fcd"]) < 1e-3
    far = ref.compare(["CCCCCCCCCCCCCCCC", "OC(=O)CCCCCCCCCCC(=O)O", "FC(F)(F)C(F)(F)F"])
    assert far["fcd"] > 1 and far["snn"] < 0.5
    assert ref.compare(["CCO"])["fcd"] is None  # fewer than 2 valid molecules: no statistics
