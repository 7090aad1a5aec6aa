"""A dataset of sequences, one per example: train / validation strings, their tokenizer and token arrays."""

from collections import Counter

import numpy as np

TOO_LONG, UNKNOWN = "longer than the length (data.length)", "with symbols outside the training split's vocabulary"


class SequenceDataset:
    """Train / validation sequences, their tokenizer and token arrays [n, l], and the held-out sets the metrics
    compare against (``references``: name -> sequences). A sequence longer than the tokenizer's length, or
    with a symbol the tokenizer does not know (the vocabulary is the training split's), is left out and
    counted in ``dropped`` (split -> reason -> count); ``repeats``: the repeated sequences removed before the
    split (``load_dataset``)."""

    def __init__(self, train: list[str], val: list[str], tokenizer, references: dict[str, list[str]] | None = None,
                 repeats: int = 0):
        self.tokenizer, self.repeats = tokenizer, repeats
        self.train, self.val = [], []
        self.dropped = {"train": Counter(), "val": Counter()}
        tokens = {}
        for name, seqs in (("train", train), ("val", val)):
            rows = []
            for s in seqs:
                try:
                    ids = tokenizer.tokenize(s)
                except ValueError:
                    self.dropped[name][UNKNOWN] += 1
                    continue
                if len(ids) > tokenizer.length:
                    self.dropped[name][TOO_LONG] += 1
                    continue
                getattr(self, name).append(s)
                rows.append(ids + [tokenizer.pad_id] * (tokenizer.length - len(ids)))
            tokens[name] = np.array(rows, dtype=np.int64).reshape(len(rows), tokenizer.length)
        self.train_tokens, self.val_tokens = tokens["train"], tokens["val"]
        self.references = references or {"val": self.val}

    def summary(self) -> str:
        """One line: what was kept, and what was left out, per split and reason."""
        left = [f"{split}: {n} {reason}" for split, reasons in self.dropped.items() for reason, n in reasons.items()]
        return (f"{len(self.train)} training and {len(self.val)} validation sequences"
                + (f"; {self.repeats} repeated sequences removed before the split" if self.repeats else "")
                + (f"; left out {', '.join(left)}" if left else ""))
