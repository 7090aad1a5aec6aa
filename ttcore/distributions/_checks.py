"""Construction-time checks shared by the distribution formats; every error states rule and value."""

import torch

_TOL = {torch.float32: 1e-4, torch.float64: 1e-9}


def check_float(name: str, x: torch.Tensor) -> None:
    if x.dtype not in _TOL:
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")


def check_ndim(name: str, x: torch.Tensor, layout: str) -> None:
    if x.dim() != len(layout.split(",")):
        raise ValueError(f"{name} must have shape [{layout}], got {tuple(x.shape)}")


def check_simplex(name: str, x: torch.Tensor, dims: tuple[int, ...], what: str) -> None:
    """Entries nonnegative and summing to one over ``dims``."""
    if bool((x < 0).any()):
        raise ValueError(f"{name} must be nonnegative, got min {x.min().item():.3g}")
    sums = x.sum(dim=dims)
    err = (sums - 1).abs().max().item() if sums.numel() else 0.0
    if err > _TOL[x.dtype] * max(1, x.shape[dims[0]]):
        raise ValueError(f"{name} must sum to 1 over {what}, got a sum off by {err:.3g}")


def check_tokens(name: str, x: torch.Tensor, b: int, l: int, v: int, allow_free: bool) -> None:
    if x.dtype != torch.long or tuple(x.shape) != (b, l):
        raise ValueError(f"{name} must be a long tensor of shape [{b}, {l}], got {x.dtype} {tuple(x.shape)}")
    lo = -1 if allow_free else 0
    if x.numel() and (int(x.min()) < lo or int(x.max()) >= v):
        raise ValueError(f"{name} entries must lie in [{lo}, {v - 1}], got [{int(x.min())}, {int(x.max())}]")


def check_positions(positions: torch.Tensor | None, b: int, l: int, device) -> torch.Tensor:
    if positions is None:
        return torch.ones(b, l, dtype=torch.bool, device=device)
    if positions.dtype != torch.bool or tuple(positions.shape) != (b, l):
        raise ValueError(f"positions must be a bool tensor of shape [{b}, {l}], "
                         f"got {positions.dtype} {tuple(positions.shape)}")
    return positions


def check_masked(tokens: torch.Tensor, mask: torch.Tensor, m: int) -> None:
    if mask.dtype != torch.bool or mask.shape != tokens.shape or tokens.dim() != 2:
        raise ValueError(f"tokens [b, l] long and mask [b, l] bool must match, "
                         f"got {tuple(tokens.shape)} and {mask.dtype} {tuple(mask.shape)}")
    if int(mask.sum()) != m:
        raise ValueError(f"head outputs must have one row per masked position: mask has "
                         f"{int(mask.sum())}, outputs have {m}")
