"""Datasets: QM9 SMILES (``chem`` extra) and public-domain English text (``text`` extra)."""

from .qm9 import SmilesDataset, load_qm9, read_qm9_smiles
from .text import TextDataset, corpus_documents, load_text, training_texts

__all__ = ["SmilesDataset", "TextDataset", "corpus_documents", "load_qm9", "load_text", "read_qm9_smiles",
           "training_texts"]
