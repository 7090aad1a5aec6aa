"""RDKit molecule metrics: validity, uniqueness among valid, novelty against the training set; a molecule's
descriptors (QED, logP, weight) and its 2-D depiction as SVG."""

from rdkit import Chem, RDLogger
from rdkit.Chem import QED, Crippen, Descriptors
from rdkit.Chem.Draw import rdMolDraw2D

RDLogger.DisableLog("rdApp.*")  # invalid samples are expected; RDKit would log every one


def _molecule(smiles: str):
    """The RDKit molecule of a non-empty string that parses and sanitizes, else None."""
    mol = Chem.MolFromSmiles(smiles) if smiles else None  # parses and sanitizes
    return mol if mol is not None and mol.GetNumAtoms() > 0 else None


def canonical(smiles: str) -> str | None:
    """Canonical SMILES of a non-empty string that parses and sanitizes, else None."""
    mol = _molecule(smiles)
    return Chem.MolToSmiles(mol) if mol is not None else None


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


def properties(smiles: str) -> dict | None:
    """One parse of a SMILES: None if invalid, else its ``canonical`` form and RDKit descriptors: ``qed``
    (Bickerton et al. 2012's drug-likeness, 0..1), ``logp`` (Wildman-Crippen octanol-water logP) and
    ``mol_weight`` (average molecular weight, g/mol)."""
    mol = _molecule(smiles)
    if mol is None:
        return None
    return {"canonical": Chem.MolToSmiles(mol), "qed": QED.qed(mol), "logp": Crippen.MolLogP(mol),
            "mol_weight": Descriptors.MolWt(mol)}


def depiction_svg(smiles: str, width: int, height: int) -> str | None:
    """A 2-D drawing of a valid SMILES as an SVG document (RDKit's MolDraw2DSVG), else None."""
    mol = _molecule(smiles)
    if mol is None:
        return None
    drawer = rdMolDraw2D.MolDraw2DSVG(width, height)
    drawer.drawOptions().clearBackground = False
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, mol)
    drawer.FinishDrawing()
    return drawer.GetDrawingText()
