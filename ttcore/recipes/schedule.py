"""The LR schedule and the resumable data order of a recipe."""

import math

import torch

SPLIT_SEED_STRIDE = 100_003  # BatchOrder: seed * stride + epoch seeds each epoch's permutation


def lr_at(step: int, lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at total_steps."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    frac = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


class BatchOrder:
    """Epoch-wise seeded permutations; the position (epoch, index) is all a resume needs. Drawn on the CPU (the
    same order on every device); on ``device`` once per epoch, so a step's indices are a slice already there
    (no host-to-device copy per step when the split lives on a GPU)."""

    def __init__(self, n: int, batch_size: int, seed: int, epoch: int = 0, index: int = 0,
                 device: torch.device | str = "cpu"):
        self.n, self.batch_size, self.seed, self.epoch, self.index = n, batch_size, seed, epoch, index
        self.device = torch.device(device)
        self._perm = self._permutation()

    def _permutation(self):
        seed = self.seed * SPLIT_SEED_STRIDE + self.epoch
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(seed)).to(self.device)

    def next(self) -> torch.Tensor:
        if self.index + self.batch_size > self.n:
            self.epoch, self.index = self.epoch + 1, 0
            self._perm = self._permutation()
        idx = self._perm[self.index: self.index + self.batch_size]
        self.index += self.batch_size
        return idx
