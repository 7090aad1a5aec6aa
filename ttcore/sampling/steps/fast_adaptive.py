"""Adaptive orderings and EB-Sampler at about the cost of a predetermined step (the fast path;
``SamplerConfig(adaptive_path="fast")``), beside the exact chain rule (``chain_rule``, ``eb``) that stays the
reference.

A step chooses its set T from every masked position's single-position marginal, computed once per step
(not once per pick) and cheaply, then draws x_T jointly with the format's predetermined draw (Sec. 4.3).
The draw is exact with respect to the joint the predetermined step draws from (the head's contraction, or
the cores with ``contraction="exact"``); only the choice of T is approximate.

The marginals it chooses by: each format writes p(x^i | x_t) as a mixture of its E head outputs with
weights that cost no V-sized output (``Decomposition.component_weights``: rank 1 one output; CP the
mixture weights, Eqs. 14-15; TT pi_{i,j} Gbar_{i,jk} from the contracted-core head, Eqs. 16-17). The step
evaluates only the ``c`` heaviest outputs of each masked position, c = CHOOSER_OUTPUTS // V (at least 1,
at most E), and chooses by their renormalized mixture: at QM9's vocabulary (V = 31) c = 66, so TT r <= 8
and CP r <= 64 evaluate every output and their marginals are exact (w.r.t. that joint), while TT r = 16
(E = 256) chooses by its 66 heaviest; at text size (V = 8192) c = 1, one V-sized output per masked
position, what a rank-1 model computes for an adaptive step. Scores then rank positions as the chain rule's first pick
does (fixed samplers: the ``counts`` best; EB: positions by the error proxy, the largest prefix whose
entropies satisfy sum H - max H <= gamma, at least one); the chain rule re-ranks after every pick with
marginals conditional on the step's earlier picks, this step does not.

What EB's rule means here: for independent draws, sum H - max H bounds the error of drawing T from the
product of its marginals instead of the joint (their total correlation); a joint draw does not make that
error, so the rule is kept as a budget on how much uncertainty one step commits (its steps-against-quality
trade-off), not as a bound.
"""

import torch

from ttcore.decompositions import get_decomposition

from ..eb import eb_accepts, eb_score
from ..joint_step import predetermined_step
from ..orderings import ADAPTIVE, entropy
from .base import ConfiguredStep

CHOOSER_OUTPUTS = 2048  # values per masked position the choice may compute (c = this // V outputs): at a
# small backbone (QM9's) the float32 softmax and mixture over c * V values per position is what a step costs


def chooser_outputs(e: int, vocab: int) -> int:
    """c, the head outputs per masked position the fast step evaluates: CHOOSER_OUTPUTS // V, in [1, E]."""
    return max(1, min(e, CHOOSER_OUTPUTS // vocab))


def chooser_marginals(model, h: torch.Tensor, masked: torch.Tensor, temperature: float) -> torch.Tensor:
    """The marginals the fast step chooses by: for each masked position, the renormalized mixture of its c
    heaviest head outputs (``Decomposition.component_weights``), float32. -> [m, v], row-major over ``masked``."""
    weights = get_decomposition(model.cfg.decomposition).component_weights(model, h, masked, temperature)  # [m, E]
    m, e = weights.shape
    hm = h[masked]
    c = chooser_outputs(e, model.cfg.dit.vocab_size - 1)
    if c == e:  # every output: one head pass over the masked positions
        top_w = weights
        logits = model.select_logits(hm, torch.zeros(m, dtype=torch.long, device=h.device), e)  # [m, e, v]
    else:  # the c heaviest outputs of each position
        top_w, top_e = weights.topk(c, dim=-1)  # [m, c]
        logits = model.gather_logits(hm, top_e)  # [m, c, v]
    q = torch.softmax(logits.float() / temperature, -1).view(m, c, -1)
    if c == 1:
        return q[:, 0]
    top_w = (top_w / top_w.sum(-1, keepdim=True).clamp_min(1e-300)).float()
    return (top_w[:, :, None] * q).sum(1)  # float32 (an einsum would run in bf16 under autocast)


class FastAdaptiveStep(ConfiguredStep):
    """Chooses its set per run (``choose``), then draws it as a predetermined step does, so runs of equal
    temperature and contraction share that draw with each other and with predetermined runs
    (``step_together``): the choice of one run never depends on another's."""

    adaptive, batchable, chooses = False, True, True  # holds c outputs per position, not the full joint

    @classmethod
    def accepts(cls, config) -> bool:
        return (config.joint and config.adaptive_path == "fast"
                and (config.eb_gamma is not None or config.ordering in ADAPTIVE))

    def draw(self, run, h, tokens, masked, chosen, counts):
        mine = self.choose(run, h, tokens, masked, counts)
        c = self.config
        return predetermined_step(run.model, h, tokens, masked, mine, c.temperature, run.generator, c.contraction)

    def choose(self, run, h, tokens, masked, counts) -> torch.Tensor:
        """This step's set T [b, l] bool: the best-scored masked positions by the chooser's marginals (the
        ``counts`` best, or EB's prefix)."""
        c = self.config
        b, l = tokens.shape
        marg = chooser_marginals(run.model, h, masked, c.temperature)  # [m, v]: the masked positions only
        score_fn = ADAPTIVE[c.ordering] if c.eb_gamma is None else eb_score(c.eb_proxy)
        score = torch.full((b, l), -float("inf"), dtype=torch.float64, device=tokens.device)
        score[masked] = score_fn(marg).double()
        order = score.argsort(dim=-1, descending=True, stable=True)  # [b, l]
        rank = order.argsort(dim=-1, stable=True)
        if counts is None:  # EB (not its last step): the largest prefix within the budget, at least one
            ent = torch.zeros((b, l), dtype=torch.float64, device=tokens.device)
            ent[masked] = entropy(marg).double()
            ent = torch.gather(ent, 1, order)  # [b, l] in rank order
            ok = eb_accepts(torch.where(torch.gather(masked, 1, order), ent, torch.zeros_like(ent)), c.eb_gamma)
            counts = (ok.cumprod(-1).sum(-1)).clamp(min=1)
        k = torch.minimum(counts, masked.sum(1))
        return (rank < k[:, None]) & masked
