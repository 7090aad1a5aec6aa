"""Datasets: a family is a ``data:`` section (``DataSection``) that ``load_dataset`` reads: QM9 and MOSES
SMILES (``chem`` extra; MOSES needs ``molsets``), public-domain English text (``text`` extra), or a file."""

from .corpora import CORPORA, Corpus, moses_files, read_sequences
from .qm9 import SmilesDataset, load_qm9, read_qm9_smiles
from .section import DataSection
from .sequences import SequenceDataset
from .sources import load_dataset
from .text import TextDataset, corpus_documents, load_text, training_texts

__all__ = ["CORPORA", "Corpus", "DataSection", "SequenceDataset", "SmilesDataset", "TextDataset", "corpus_documents",
           "load_dataset", "load_qm9", "load_text", "moses_files", "read_qm9_smiles", "read_sequences",
           "training_texts"]
