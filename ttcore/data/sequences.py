"""A dataset of sequences, one per example: train / validation strings, their tokenizer and token arrays."""

import numpy as np


class SequenceDataset:
    """Train / validation sequences, their tokenizer and token arrays [n, l], and the held-out sets the metrics
    compare against (``references``: name -> sequences). Sequences longer than the tokenizer's length are
    left out and counted in ``dropped``."""

    def __init__(self, train: list[str], val: list[str], tokenizer, references: dict[str, list[str]] | None = None):
        self.tokenizer = tokenizer
        self.train, self.val, self.dropped = [], [], 0
        tokens = {}
        for name, seqs in (("train", train), ("val", val)):
            rows = []
            for s in seqs:
                ids = tokenizer.tokenize(s)
                if len(ids) > tokenizer.length:
                    self.dropped += 1
                    continue
                getattr(self, name).append(s)
                rows.append(ids + [tokenizer.pad_id] * (tokenizer.length - len(ids)))
            tokens[name] = np.array(rows, dtype=np.int64).reshape(len(rows), tokenizer.length)
        self.train_tokens, self.val_tokens = tokens["train"], tokens["val"]
        self.references = references or {"val": self.val}
