"""The exponential moving average of a model's weights (validated, checkpointed and exported when asked)."""

import contextlib

import torch

from ttcore.models import JointModel


class WeightEMA:
    """Exponential moving average of the trainable weights, in float32, with the usual warm-up decay
    min(decay, (1 + n) / (10 + n)) after n updates, so early averages do not stay near the initialization."""

    def __init__(self, model: JointModel, decay: float, updates: int = 0):
        self.decay, self.updates = decay, updates
        self.shadow = {n: p.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, model: JointModel) -> None:
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for n, p in model.named_parameters():
            if n in self.shadow:
                self.shadow[n].mul_(d).add_(p.detach().float(), alpha=1 - d)
        self.updates += 1

    @contextlib.contextmanager
    def applied(self, model: JointModel):
        """The model holds the averaged weights inside the block, its own after; yields its own weights."""
        params = dict(model.named_parameters())
        raw = {n: params[n].detach().clone() for n in self.shadow}
        with torch.no_grad():
            for n, v in self.shadow.items():
                params[n].copy_(v)
        try:
            yield raw
        finally:
            with torch.no_grad():
                for n, v in raw.items():
                    params[n].copy_(v)
