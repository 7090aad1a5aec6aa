import pytest

from ttcore.metrics import canonical, molecule_metrics


def test_validity_uniqueness_novelty():
    samples = ["CCO", "OCC", "C1CC", "", "c1ccccc1", "C(C)(C)(C)(C)C"]  # ring not closed; pentavalent C
    assert canonical("OCC") == "CCO"
    m = molecule_metrics(samples, training={"CCO"})
    assert m["validity"] == pytest.approx(3 / 6)
    assert m["uniqueness"] == pytest.approx(2 / 3)
    assert m["novelty"] == pytest.approx(1 / 3)


def test_a_molecule_whose_canonical_smiles_rdkit_cannot_read_back_is_not_valid():
    """A MOSES sample of the GPU-trained rank 1: RDKit parses it, but writes its canonical SMILES as one it cannot
    parse (the distribution metrics, which read canonical SMILES, failed on it)."""
    from rdkit import Chem

    sample = "CSc1ncc(CO)n1CCc1=oc2c(C)cccc(C)n12"
    assert Chem.MolFromSmiles(sample) is not None and Chem.MolFromSmiles(Chem.MolToSmiles(
        Chem.MolFromSmiles(sample))) is None
    assert canonical(sample) is None
    assert molecule_metrics([sample, "CCO"])["validity"] == pytest.approx(1 / 2)


def test_genmol_quality_counts_valid_unique_druglike_synthesizable_samples():
    """Quality = |{valid, unique, QED >= 0.6, SA <= 4}| / all samples (GenMol): ibuprofen twice (two spellings)
    counts once; benzene is valid but not drug-like (QED 0.44); an invalid string counts in the denominator."""
    from rdkit import Chem
    from rdkit.Chem import QED

    from ttcore.metrics.molecules import quality, sa_score

    ibuprofen, benzene = Chem.MolFromSmiles("CC(C)Cc1ccc(cc1)C(C)C(=O)O"), Chem.MolFromSmiles("c1ccccc1")
    assert QED.qed(ibuprofen) >= 0.6 and sa_score(ibuprofen) <= 4 and QED.qed(benzene) < 0.6
    assert 1 <= sa_score(benzene) < sa_score(Chem.MolFromSmiles("CC1(C)CC2CC3(O)C(C)C(O)C4OC4C3C2C1O")) <= 10
    samples = ["CC(C)Cc1ccc(cc1)C(C)C(=O)O", "OC(=O)C(C)c1ccc(CC(C)C)cc1", "c1ccccc1", "C1CC"]
    m = molecule_metrics(samples)
    assert m["quality"] == pytest.approx(1 / 4)
    assert quality([canonical(s) for s in samples[:3]], 3) == pytest.approx(1 / 3)
