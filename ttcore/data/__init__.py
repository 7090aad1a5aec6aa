"""Datasets: QM9 SMILES (``chem`` extra)."""

from .qm9 import SmilesDataset, load_qm9, read_qm9_smiles

__all__ = ["SmilesDataset", "load_qm9", "read_qm9_smiles"]
