import pytest

from ttcore.metrics import canonical, molecule_metrics


def test_validity_uniqueness_novelty():
    samples = ["CCO", "OCC", "C1CC", "", "c1ccccc1", "C(C)(C)(C)(C)C"]  # ring not closed; pentavalent C
    assert canonical("OCC") == "CCO"
    m = molecule_metrics(samples, training={"CCO"})
    assert m["validity"] == pytest.approx(3 / 6)
    assert m["uniqueness"] == pytest.approx(2 / 3)
    assert m["novelty"] == pytest.approx(1 / 3)
