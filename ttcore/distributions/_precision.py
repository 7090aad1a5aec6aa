"""The formats' products run in their inputs' own dtype, whatever autocast the caller is under."""

import functools

import torch


def own_precision(fn):
    """Run ``fn`` with autocast off on the device of its first tensor argument, so that its matmuls and
    einsums keep their inputs' dtype (float32 or float64). The recipes and the service run the backbone
    under bf16 autocast, which would otherwise run these r x r chain products in bf16 too: a one-position
    mask's joint and marginal log-probabilities (the same number) then differed by 3.2e-3 nats on
    qm9-tt-r16. The products are small; bf16 buys nothing here."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensor = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if tensor is None or not torch.is_autocast_enabled(tensor.device.type):
            return fn(*args, **kwargs)
        with torch.autocast(tensor.device.type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper
