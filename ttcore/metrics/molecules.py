"""RDKit molecule metrics: validity, uniqueness among valid, novelty against the training set."""

from rdkit import Chem, RDLogger

RDLogger.DisableLog("rdApp.*")  # invalid samples are expected; RDKit would log every one


def canonical(smiles: str) -> str | None:
    """Canonical SMILES of a non-empty string that parses and sanitizes, else None."""
    if not smiles:
        return None
    mol = Chem.MolFromSmiles(smiles)  # parses and sanitizes
    if mol is None or mol.GetNumAtoms() == 0:
        return None
    return Chem.MolToSmiles(mol)


def molecule_metrics(samples: list[str], training: set[str] | None = None) -> dict:
    """validity = valid / all; uniqueness = distinct canonical / valid; novelty = valid not in
    ``training`` (canonical SMILES) / valid, as in MDLM/UDLM."""
    canon = [canonical(s) for s in samples]
    valid = [c for c in canon if c is not None]
    out = {"n": len(samples), "validity": len(valid) / max(1, len(samples)),
           "uniqueness": len(set(valid)) / max(1, len(valid))}
    if training is not None:
        out["novelty"] = sum(c not in training for c in valid) / max(1, len(valid))
    return out
