"""One denoising step's draw of several tokens, jointly and exactly (Sec. 4.3).

- ``predetermined_step``: the set T is fixed before the head runs (random, left-to-right, Halton):
  x_T is drawn jointly from p(x_T | x_t). For TT, full V x r x r cores are computed on T only; every
  other masked position enters through its contracted core sum_x G_j(x), either predicted by the
  contracted-core head (``contraction="head"``, the paper's Sec. 4.3 special case: the draw is exact
  with respect to the joint whose off-T factors are the head's Gbar_j, an approximation of the cores'
  own sum) or summed from the cores themselves (``contraction="exact"``: exact with respect to the TT
  of Eq. 9, at the cost of all V x r x r outputs on every masked position). At a temperature other
  than 1 the head is not used (it predicts the untempered sum), so both settings are exact there.
- ``chain_rule_step``: adaptive orderings and EB-Sampler: repeat {marginal inference given this
  step's picks; pick the best position; sample it}, so the step's tokens are one joint sample.
"""

import torch

from ttcore.distributions import (CP, Factorized, TensorTrain, sample_categorical, tt_contracted_from_logits,
                                  tt_cores_from_logits, tt_sample_path)

from .eb import eb_accepts
from .orderings import entropy


CONTRACTIONS = ("head", "exact")
_EXACT_CHUNK = 64  # positions per exact-contraction pass: bounds the [n, v, r, r] float64 logits held at once


def softmax64(logits: torch.Tensor, temperature: float, dim: int = -1) -> torch.Tensor:
    """float64 probabilities of logits / temperature, for categorical draws (the paper samples from
    64-bit probabilities; a float32 softmax would truncate the small ones before the float64 draw)."""
    return torch.softmax(logits.double() / temperature, dim)


def exact_contracted_cores(model, h: torch.Tensor, temperature: float) -> torch.Tensor:
    """sum_x G_j(x) of the tempered, row-normalized cores (Eq. 10, Eq. 16 with j outside S), from the
    head's V x r x r outputs, in float64, chunked over positions. h [n, d] -> [n, r, r]."""
    parts = [tt_contracted_from_logits(model.core_logits(chunk).double() / temperature)
             for chunk in h.split(_EXACT_CHUNK)]
    return torch.cat(parts)


def joint_distribution(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, temperature: float):
    """p(x | x_t) over the whole sequence from the head on the masked positions (known ones exact).

    Rank 1 in float64. CP and TT hold full factors / cores for every masked position ([m, r, v] and
    [m, v, r, r]; a text sample's TT r=4 cores are 67 MB in float32), so they stay float32: their
    marginals are computed in float32 and each draw renormalizes them in float64 (sample_categorical)."""
    out = model.head_outputs(h, masked)
    if out.weight_logits is not None:
        return CP.from_masked(torch.softmax(out.weight_logits / temperature, -1),
                              torch.softmax(out.logits / temperature, -1), x, masked)
    if out.logits.dim() == 4:
        return TensorTrain.from_masked(tt_cores_from_logits(out.logits / temperature), x, masked)
    return Factorized.from_masked(softmax64(out.logits, temperature), x, masked)


def predetermined_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
                       temperature: float, generator: torch.Generator | None, contraction: str = "head") -> torch.Tensor:
    """Joint draw of x_T, T = ``chosen`` [b, l] (a subset of ``masked``). -> [b, l], -1 off T.

    Rank 1: independent draws (MDLM). CP (Eq. 18): a component per sequence, then each x^j from that
    component's factor, computed for that component only. TT: ancestral sampling of the hidden
    chain (``tt_sample_path``): the masked positions outside T enter through contracted cores (from the
    contracted-core head, or exact: see the module docstring), and at a chosen position only the core
    row of the sampled state is computed (r outputs of the r * r). All draws from float64 probabilities.
    """
    values = torch.full_like(x, -1)
    if not chosen.any():
        return values
    b, l = x.shape
    rows_of = chosen.nonzero()[:, 0]  # [m] batch row of each chosen position
    decomposition = model.cfg.decomposition
    if decomposition in ("none", "cp"):
        comp = torch.zeros(b, dtype=torch.long, device=x.device)
        if decomposition == "cp":
            comp = sample_categorical(softmax64(model.cp_weight_logits(h), temperature), generator)
        logits = model.select_logits(h[chosen], comp[rows_of], 1)[:, 0]  # [m, v]
        values[chosen] = sample_categorical(softmax64(logits, temperature), generator, rows_of)
        return values
    r = model.cfg.rank
    if contraction not in CONTRACTIONS:
        raise ValueError(f"contraction must be one of {CONTRACTIONS}, got {contraction!r}")
    contracted = torch.eye(r, dtype=torch.float64, device=x.device).repeat(b, l, 1, 1)  # known: I
    pos = torch.arange(l, device=x.device)
    last = torch.where(chosen, pos, -1).amax(1)  # [b] last chosen position: the rows after it sum to 1
    rest = masked & ~chosen & (pos < last[:, None])
    if rest.any():
        if contraction == "head" and temperature == 1.0:  # Gbar_j from the contracted-core head
            contracted[rest] = model.contracted_cores(h[rest]).to(contracted.dtype)
        else:  # the cores' own sum (the head knows only temperature 1)
            contracted[rest] = exact_contracted_cores(model, h[rest], temperature)

    def core_rows(n, t, j):  # G_t(x, j, k) for the sampled state j of rows n: [n, v, r]
        logits = model.select_logits(h[n, t], j * r, r)  # [n, k, v]
        return softmax64(logits.reshape(len(n), -1), temperature).view(len(n), r, -1).transpose(1, 2)

    return tt_sample_path(contracted, chosen, core_rows, generator)


def chain_rule_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, count: torch.Tensor | None,
                    score_fn, temperature: float, generator: torch.Generator | None,
                    eb_gamma: float | None = None) -> torch.Tensor:
    """Pick-and-sample ``count`` [b] tokens one at a time (Sec. 4.3, chain rule), each time the
    free masked position with the highest ``score_fn(marginals)``. With ``eb_gamma`` the count is
    EB-Sampler's: picks go on while the entropies of this step's picks (each conditional on the
    earlier ones) satisfy the bound, at least one; ``count`` (None: all masked) caps it.
    -> [b, l], -1 where nothing was drawn."""
    b, l = x.shape
    dist = joint_distribution(model, h, x, masked, temperature)
    x_cond = torch.where(masked, torch.full_like(x, -1), x)
    cap = masked.sum(1) if count is None else torch.minimum(count, masked.sum(1))
    picked = torch.zeros(b, dtype=torch.long, device=x.device)
    entropies = torch.zeros(b, 0, dtype=torch.float64, device=x.device)
    active = picked < cap
    rows = torch.arange(b, device=x.device)
    while active.any():
        marg = dist.marginals(x_cond)  # TT caches sum_x G_j, which does not depend on the picks
        free = masked & (x_cond < 0)
        score = torch.where(free, score_fn(marg).double(), torch.full((b, l), -float("inf"), dtype=torch.float64,
                                                                           device=x.device))
        pos = score.argmax(-1)  # [b]
        p = marg[rows, pos]  # [b, v]
        if eb_gamma is not None:
            h_new = torch.cat([entropies, entropy(p).double()[:, None]], 1)
            ok = eb_accepts(h_new, eb_gamma)[:, -1] | (picked == 0)
            active = active & ok
            entropies = torch.where(active[:, None], h_new, torch.cat([entropies, entropies.new_zeros(b, 1)], 1))
        draw = sample_categorical(p, generator)
        x_cond[rows[active], pos[active]] = draw[active]
        picked = picked + active.long()
        active = active & (picked < cap)
    return torch.where(masked & (x_cond >= 0), x_cond, torch.full_like(x, -1))

