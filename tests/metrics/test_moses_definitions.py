"""Our MOSES metrics against molsets 0.3.1's own code on shared molecule sets (MOSES's test and
scaffold-test molecules): FCD (its fcd_torch against our fcd), SNN, Frag, Scaf, IntDiv_1, IntDiv_2, valid,
unique@k and novelty agree to float rounding.

molsets 0.3.1 does not import on today's stack as shipped: it calls ``DataFrame.append`` (removed in pandas 2)
and its SA-score module imports ``rdkit.six`` (removed from RDKit). Both are supplied here, before its import,
by the functions they named (``pd.concat``, ``dict.items``); neither touches the metrics compared."""

import importlib
import importlib.util
import math
import pickle
import sys
import types

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("moses", "fcd_torch", "fcd")),
    reason="needs molsets and fcd-torch (pip install --no-deps molsets==0.3.1 fcd-torch==1.0.7)")]


@pytest.fixture(scope="module")
def moses_metrics():
    import pandas as pd

    patched = not hasattr(pd.DataFrame, "append")
    if patched:
        pd.DataFrame.append = lambda self, other, sort=False: pd.concat([self, other], sort=sort)
    six, moves = types.ModuleType("rdkit.six"), types.ModuleType("rdkit.six.moves")
    six.iteritems, six.PY3, moves.cPickle, six.moves = (lambda d: iter(d.items())), True, pickle, moves
    saved = {k: sys.modules.get(k) for k in ("rdkit.six", "rdkit.six.moves")}
    sys.modules.update({"rdkit.six": six, "rdkit.six.moves": moves})
    try:
        yield importlib.import_module("moses.metrics.metrics")
    finally:
        for k, v in saved.items():
            sys.modules.pop(k) if v is None else sys.modules.__setitem__(k, v)
        if patched:
            del pd.DataFrame.append


@pytest.fixture(scope="module")
def sets():
    from ttcore.data import moses_files, read_sequences

    test = read_sequences(moses_files()["test"])
    scaffold_test = read_sequences(moses_files()["test_scaffolds"])
    gen = test[400:700] + scaffold_test[:300] + ["C1CC", "not a molecule", test[401]]  # invalid and repeated too
    return test[:400], gen, set(test[600:2000])


def test_distribution_metrics_match_moses(moses_metrics, sets):
    from ttcore.metrics.distribution import Reference, fingerprints, internal_diversity

    ref, gen, _ = sets
    ours = Reference(ref, "cpu").compare(gen)
    ours["int_div2"] = internal_diversity(fingerprints(Reference.canonical_valid(gen)), p=2)
    valid = moses_metrics.remove_invalid(gen, canonize=True)
    theirs = {"fcd": moses_metrics.FCDMetric(device="cpu")(gen=valid, ref=ref),
              "snn": moses_metrics.SNNMetric()(gen=valid, ref=ref),
              "frag": moses_metrics.FragMetric()(gen=valid, ref=ref),
              "scaf": moses_metrics.ScafMetric()(gen=valid, ref=ref),
              "int_div": moses_metrics.internal_diversity(valid),
              "int_div2": moses_metrics.internal_diversity(valid, p=2)}
    assert theirs["scaf"] > 0.05 and theirs["frag"] < 0.999  # sets on which the definitions could differ
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(float(value), rel=1e-5, abs=1e-6), name


def test_cosine_of_an_empty_count_set_is_nan_as_in_moses(moses_metrics):
    from ttcore.metrics.distribution import cosine_similarity

    counts = {"c1ccccc1": 2, "C1CC1": 1}
    for a, b in ((counts, {}), ({}, counts), ({}, {})):
        assert math.isnan(moses_metrics.cos_similarity(a, b)) and math.isnan(cosine_similarity(a, b))
    assert cosine_similarity(counts, counts) == pytest.approx(moses_metrics.cos_similarity(counts, counts))


def test_counting_metrics_match_moses(moses_metrics, sets):
    from ttcore.metrics.distribution import moses_counts

    _, gen, train = sets
    ours = moses_counts(gen, train, ks=(100, 500))
    valid = moses_metrics.remove_invalid(gen, canonize=True)
    assert ours["valid"] == pytest.approx(moses_metrics.fraction_valid(gen))
    assert ours["unique@100"] == pytest.approx(moses_metrics.fraction_unique(valid, 100))
    assert ours["unique@500"] == pytest.approx(moses_metrics.fraction_unique(valid, 500))
    assert ours["novelty"] == pytest.approx(moses_metrics.novelty(valid, train))
    assert 0 < ours["novelty"] < 1
