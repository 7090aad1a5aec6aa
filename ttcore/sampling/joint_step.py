"""One denoising step's draw of several tokens, jointly and exactly (Sec. 4.3).

- ``predetermined_step``: the set T is fixed before the head runs (random, left-to-right, Halton):
  x_T is drawn jointly from p(x_T | x_t) by the model's format (``ttcore.decompositions``),
  which computes only the head outputs the draw needs.
- ``marginal_step``: each chosen position from its exact single-position marginal (the rank-1 view).

The chain rule of adaptive orderings and EB-Sampler is the chain-rule step's own (``steps.chain_rule``).
"""

import torch

from ttcore.distributions import Site, sample_categorical, uniforms


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
