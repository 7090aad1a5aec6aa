"""One denoising step's draw of several tokens, jointly and exactly (Sec. 4.3).

- ``predetermined_step``: the set T is fixed before the head runs (random, left-to-right, Halton):
  x_T is drawn jointly from p(x_T | x_t) by the model's format (``ttcore.decompositions``),
  which computes only the head outputs the draw needs.
- ``chain_rule_step``: adaptive orderings and EB-Sampler: repeat {marginal inference given this
  step's picks; pick the best position; sample it}, so the step's tokens are one joint sample.
"""

import torch

from ttcore.distributions import Site, sample_categorical, uniforms
from ttcore.distributions.automaton import Constrained

from .eb import eb_accepts
from .orderings import entropy


def joint_distribution(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, temperature: float):
    """p(x | x_t) over the whole sequence from the head on the masked positions (known ones exact)."""
    return model.head_outputs(h, masked).joint(x, temperature)


def predetermined_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
                       temperature: float, generator: torch.Generator | None,
                       contraction: str = "head") -> torch.Tensor:
    """Joint draw of x_T, T = ``chosen`` [b, l] (a subset of ``masked``), all from float64 probabilities.
    -> [b, l], -1 off T. ``contraction`` (TT): see ``ttcore.decompositions.tt``."""
    if not chosen.any():
        return torch.full_like(x, -1)
    return model.format.draw(model.head, h, x, masked, chosen, temperature, generator, contraction)


def marginal_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor | None,
                  count: torch.Tensor | None, score_fn, temperature: float,
                  generator: torch.Generator | None, contraction: str = "head") -> torch.Tensor:
    """The "rank-1 view" of a joint model: each position of this step drawn independently from the
    joint's exact single-position marginal p(x^i | x_t) (Eqs. 14-17, S = the known positions): the same
    network and the same marginals, without the joint draw. The positions are ``chosen`` [b, l]
    (predetermined orderings: the marginals at those positions only, of the joint that
    ``predetermined_step`` would draw from with the same ``contraction``; ``Decomposition.marginals_at``)
    or the ``count`` [b] best by ``score_fn`` of every masked position's marginal under the TT of Eq. 9
    (adaptive, as ``chain_rule_step``). Position i draws at lane i of ``Site.draw``. -> [b, l], -1 where
    nothing was drawn."""
    b, l = x.shape
    values = torch.full_like(x, -1)
    u = uniforms(generator, b, l, x.device, Site.draw)
    if chosen is not None:
        if chosen.any():
            marg = model.format.marginals_at(model.head, h, masked, chosen, temperature, contraction)
            values[chosen] = sample_categorical(marg, u=u[chosen])
        return values
    x_cond = torch.where(masked, torch.full_like(x, -1), x)
    marg = joint_distribution(model, h, x, masked, temperature).marginals(x_cond)  # [b, l, v]
    score = torch.where(masked, score_fn(marg).double(), torch.full((b, l), -float("inf"), dtype=torch.float64,
                                                                      device=x.device))
    k = masked.sum(1) if count is None else torch.minimum(count, masked.sum(1))
    rank = score.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1, stable=True)
    chosen = (rank < k[:, None]) & masked
    if chosen.any():
        values[chosen] = sample_categorical(marg[chosen], u=u[chosen])
    return values


def chain_rule_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, count: torch.Tensor | None,
                    score_fn, temperature: float, generator: torch.Generator | None,
                    eb_gamma: float | None = None, automaton=None) -> torch.Tensor:
    """Pick-and-sample ``count`` [b] tokens one at a time (Sec. 4.3, chain rule), each time the
    free masked position with the highest ``score_fn(marginals)``. With ``eb_gamma`` the count of a
    sequence whose ``count`` is -1 is EB-Sampler's: picks go on while the entropies of this step's picks
    (each conditional on the earlier ones) satisfy the bound, at least one, up to every masked position;
    ``count`` (None: all masked) caps the others. The p-th pick draws at lane p of ``Site.chain``.
    ``automaton`` (``Automata``, one per row): the chain rule on the joint restricted to its language
    (``ttcore.sampling.constrained``). -> [b, l], -1 where nothing was drawn."""
    b, l = x.shape
    dist = joint_distribution(model, h, x, masked, temperature)
    if automaton is not None:  # x_t's known tokens move the automaton by a gather (``backward_messages``)
        dist = Constrained(dist, automaton, torch.where(masked, torch.full_like(x, -1), x))
    x_cond = torch.where(masked, torch.full_like(x, -1), x)
    n_masked = masked.sum(1)
    count = n_masked if count is None else count
    by_eb = count < 0 if eb_gamma is not None else torch.zeros_like(masked[:, 0])  # [b]: EB's bound decides
    cap = torch.where(count < 0, n_masked, torch.minimum(count, n_masked))
    u = uniforms(generator, b, l, x.device, Site.chain)
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
            ok = eb_accepts(h_new, eb_gamma)[:, -1] | (picked == 0) | ~by_eb
            active = active & ok
            entropies = torch.where(active[:, None], h_new, torch.cat([entropies, entropies.new_zeros(b, 1)], 1))
        draw = sample_categorical(p, u=u[rows, picked.clamp_max(l - 1)])
        x_cond[rows[active], pos[active]] = draw[active]
        picked = picked + active.long()
        active = active & (picked < cap)
    return torch.where(masked & (x_cond >= 0), x_cond, torch.full_like(x, -1))
