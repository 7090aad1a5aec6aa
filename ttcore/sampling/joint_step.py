"""One denoising step's draw of several tokens, jointly and exactly (Sec. 4.3).

- ``predetermined_step``: the set T is fixed before the head runs (random, left-to-right, Halton):
  x_T is drawn jointly from p(x_T | x_t). For TT, full V x r x r cores are computed on T only and
  the contracted-core head stands in for every other masked position (Sec. 4.3, special case).
- ``chain_rule_step``: adaptive orderings and EB-Sampler: repeat {marginal inference given this
  step's picks; pick the best position; sample it}, so the step's tokens are one joint sample.
"""

import torch

from ttcore.distributions import CP, Factorized, TensorTrain, sample_categorical, tt_cores_from_logits, tt_sample_path

from .eb import eb_accepts
from .orderings import entropy


def softmax32(logits: torch.Tensor, temperature: float, dim: int = -1) -> torch.Tensor:
    """float32 probabilities of logits / temperature; a bf16 input is upcast inside the softmax kernel."""
    if temperature != 1.0:
        logits = logits.float() / temperature
    return torch.softmax(logits, dim, dtype=torch.float32)


def joint_distribution(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, temperature: float):
    """p(x | x_t) over the whole sequence from the head on the masked positions (known ones exact)."""
    out = model.head_outputs(h, masked)
    if out.weight_logits is not None:
        return CP.from_masked(torch.softmax(out.weight_logits / temperature, -1),
                              torch.softmax(out.logits / temperature, -1), x, masked)
    if out.logits.dim() == 4:
        return TensorTrain.from_masked(tt_cores_from_logits(out.logits / temperature), x, masked)
    return Factorized.from_masked(torch.softmax(out.logits / temperature, -1), x, masked)


def predetermined_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
                       temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Joint exact draw of x_T, T = ``chosen`` [b, l] (a subset of ``masked``). -> [b, l], -1 off T.

    Rank 1: independent draws (MDLM). CP (Eq. 18): a component per sequence, then each x^j from that
    component's factor, computed for that component only. TT: ancestral sampling of the hidden
    chain (``tt_sample_path``): the contracted-core head covers the masked positions outside T, and at
    a chosen position only the core row of the sampled state is computed (r outputs of the r * r).
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
            comp = sample_categorical(softmax32(model.cp_weight_logits(h), temperature), generator)
        logits = model.select_logits(h[chosen], comp[rows_of], 1)[:, 0]  # [m, v]
        values[chosen] = sample_categorical(softmax32(logits, temperature), generator, rows_of)
        return values
    r = model.cfg.rank
    contracted = torch.eye(r, dtype=torch.float32, device=x.device).repeat(b, l, 1, 1)  # known: I
    pos = torch.arange(l, device=x.device)
    last = torch.where(chosen, pos, -1).amax(1)  # [b] last chosen position: the rows after it sum to 1
    rest = masked & ~chosen & (pos < last[:, None])
    if rest.any():  # Gbar_j from the contracted-core head, never from V x r x r cores
        contracted[rest] = model.contracted_cores(h[rest]).to(contracted.dtype)

    def core_rows(n, t, j):  # G_t(x, j, k) for the sampled state j of rows n: [n, v, r]
        logits = model.select_logits(h[n, t], j * r, r)  # [n, k, v]
        return softmax32(logits.reshape(len(n), -1), temperature).view(len(n), r, -1).transpose(1, 2)

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

