"""RDKit molecule metrics: validity, uniqueness among valid, novelty against the training set, GenMol's quality;
a molecule's descriptors (QED, logP, weight), its synthetic accessibility and its 2-D depiction as SVG."""

import functools
import importlib.util
import os

from rdkit import Chem, RDLogger
from rdkit.Chem import QED, Crippen, Descriptors
from rdkit.Chem.Draw import rdMolDraw2D

RDLogger.DisableLog("rdApp.*")  # invalid samples are expected; RDKit would log every one


def _molecule(smiles: str, one_molecule: bool = False):
    """The RDKit molecule of a non-empty string without whitespace that parses and sanitizes (and with
    ``one_molecule``, is one connected molecule: a single fragment), else None. Whitespace: RDKit reads what
    follows a space as the molecule's name, so ``"C junk"`` would pass as methane."""
    if not smiles or any(c.isspace() for c in smiles):
        return None
    mol = Chem.MolFromSmiles(smiles)  # parses and sanitizes
    if mol is None or mol.GetNumAtoms() == 0:
        return None
    return None if one_molecule and len(Chem.GetMolFrags(mol)) > 1 else mol


def _read_back(smiles: str, one_molecule: bool = False) -> tuple[str, Chem.Mol] | None:
    """A valid molecule's canonical SMILES and the molecule read back from it, else None (``canonical``'s rule)."""
    mol = _molecule(smiles, one_molecule)
    if mol is None:
        return None
    text = Chem.MolToSmiles(mol)
    again = Chem.MolFromSmiles(text)
    return None if again is None else (text, again)


def canonical(smiles: str, one_molecule: bool = False) -> str | None:
    """Canonical SMILES of a non-empty string that parses and sanitizes and whose canonical SMILES parses again,
    else None; ``one_molecule``: also None for several disconnected fragments (``A.B``). The round trip: RDKit
    writes a few rare molecules (a hypervalent aromatic oxygen, ``c1=oc...``, about 1 in 30,000 MOSES samples of
    a young model; a fused ring it kekulizes one way and not back, ``C=1CC=2ccnnc21``) as SMILES it cannot read
    back, and every metric after validity (fingerprints, fragments, ChemNet, QED) reads the canonical SMILES."""
    found = _read_back(smiles, one_molecule)
    return None if found is None else found[0]


def randomized_smiles(smiles: str, n: int, seed: int = 0) -> list[str]:
    """``n`` randomized SMILES of a molecule (random atom orders, RDKit's ``MolToRandomSmilesVect``, seeded): the
    same molecule spelled differently (Arus-Pous et al. 2019's augmentation); none for an invalid string."""
    mol = _molecule(smiles)
    return [] if mol is None else list(Chem.MolToRandomSmilesVect(mol, n, randomSeed=seed))


QUALITY_QED, QUALITY_SA = 0.6, 4.0  # GenMol's thresholds: drug-like and synthesizable


@functools.cache
def _sascorer():
    """RDKit's Contrib SA_Score (Ertl & Schuffenhauer 2009), shipped with RDKit's wheels (its fragment table is
    RDKit's own data file)."""
    from rdkit.Chem import RDConfig

    path = os.path.join(RDConfig.RDContribDir, "SA_Score", "sascorer.py")
    spec = importlib.util.spec_from_file_location("sascorer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sa_score(mol) -> float:
    """Synthetic accessibility, 1 (easy) .. 10 (hard), of an RDKit molecule (``_sascorer``)."""
    return _sascorer().calculateScore(mol)


def quality(canonical_valid: list[str], n: int) -> float:
    """GenMol's quality (Lee et al. 2025): the fraction of all ``n`` samples that are valid, unique (each distinct
    molecule counted once), drug-like (QED >= 0.6) and synthesizable (SA <= 4)."""
    good = 0
    for smiles in set(canonical_valid):
        mol = Chem.MolFromSmiles(smiles)
        drug_likeness = _qed(mol)
        good += drug_likeness is not None and drug_likeness >= QUALITY_QED and sa_score(mol) <= QUALITY_SA
    return good / max(1, n)


def _qed(mol) -> float | None:
    """QED of a valid molecule, or None where RDKit cannot compute it (its hydrogen removal sanitizes the
    molecule again, and a molecule RDKit read may still fail that)."""
    try:
        return QED.qed(mol)
    except Chem.MolSanitizeException:
        return None


def molecule_metrics(samples: list[str], training: set[str] | None = None, one_molecule: bool = True) -> dict:
    """validity = valid / all; uniqueness = distinct canonical / valid; novelty = valid not in
    ``training`` (canonical SMILES) / valid, as in MDLM/UDLM; ``quality``: GenMol's (``quality``). A sample is
    valid when RDKit reads it (``canonical``) and, with ``one_molecule`` (the default: no molecule of QM9, MOSES or
    their SAFE and SELFIES forms has two fragments), it is one connected molecule: a SAFE string with a broken
    attachment digit decodes to fragments, which count as invalid."""
    canon = [canonical(s, one_molecule) for s in samples]
    valid = [c for c in canon if c is not None]
    out = {"n": len(samples), "validity": len(valid) / max(1, len(samples)),
           "uniqueness": len(set(valid)) / max(1, len(valid)), "quality": quality(valid, len(samples))}
    if training is not None:
        out["novelty"] = sum(c not in training for c in valid) / max(1, len(valid))
    return out


def properties(smiles: str, one_molecule: bool = True) -> dict | None:
    """One parse of a SMILES: None if invalid (as ``molecule_metrics`` counts it, ``canonical``'s rule: with
    ``one_molecule``, several fragments are invalid), else its ``canonical`` form and RDKit descriptors of the
    molecule read back from it: ``qed`` (Bickerton et al. 2012's drug-likeness, 0..1; None where RDKit cannot
    compute it, ``_qed``), ``logp`` (Wildman-Crippen octanol-water logP) and ``mol_weight`` (average molecular
    weight, g/mol)."""
    found = _read_back(smiles, one_molecule)
    if found is None:
        return None
    text, mol = found
    return {"canonical": text, "qed": _qed(mol), "logp": Crippen.MolLogP(mol), "mol_weight": Descriptors.MolWt(mol)}


def depiction_svg(smiles: str, width: int, height: int) -> str | None:
    """A 2-D drawing of a valid SMILES (``canonical``'s rule, fragments allowed) as an SVG document (RDKit's
    MolDraw2DSVG), else None (also where RDKit cannot prepare it for drawing: the drawing kekulizes)."""
    found = _read_back(smiles)
    if found is None:
        return None
    drawer = rdMolDraw2D.MolDraw2DSVG(width, height)
    drawer.drawOptions().clearBackground = False
    try:
        rdMolDraw2D.PrepareAndDrawMolecule(drawer, found[1])
    except Chem.MolSanitizeException:
        return None
    drawer.FinishDrawing()
    return drawer.GetDrawingText()
