"""Adaptive orderings and EB-Sampler at about the cost of a predetermined step (the fast path;
``SamplerConfig(adaptive_path="fast")``), beside the exact chain rule (``chain_rule``, ``eb``) that stays the
reference.

A step chooses its set T by scoring every masked position once (not once per pick, as the chain rule does),
then draws x_T jointly with the format's predetermined draw (Sec. 4.3), which is exact with respect to the
joint a predetermined step draws from (the head's contraction outside T, or the cores with
``contraction="exact"`` or a temperature other than 1). Only the choice of T is approximate: what it
scores by is the ``chooser``, defined here and measured against the exact marginals by
``benchmarks/chooser_distance.py`` (docs: Benchmarks, "the fast path's chooser").

The chooser of a masked position i: each format writes p(x^i | x_t) as a mixture of its E head outputs
(``Decomposition.component_weights``): rank 1 one output; CP the tempered mixture weights (Eqs. 14-15); TT
w_{(j,k)} = pi_{i,j} Gbar_{i,jk} (Eqs. 16-17) with pi and Gbar from the contracted-core head at every
masked position (position i included: its row j split over k by the head's Gbar_i, not by the sums of its
own cores) and the outputs at temperature T (the weights at temperature 1). The step evaluates the c
heaviest outputs (c = ``ChooserSettings.chooser_outputs``, default CHOOSER_OUTPUTS // V, in [1, E]) and
renormalizes their mixture, so its distance to the full mixture is at most the dropped weight (total
variation <= 1 - the c weights' sum). Its distance to the exact marginal adds the head's error: for CP and
rank 1 the full mixture is exact; for TT it is the marginal of the train whose masked positions are all the
head's contracted cores. Measured on the bundled checkpoints (bf16, their own samples masked at t = 0.25 to
1), mean TV to the exact marginal: QM9 CP r = 64 0 (c = E), QM9 TT r = 16 0.014 (c = 66 of 256), MOSES TT
r = 8 0.034 (c = E), text TT r = 4 0.54 at the default c = 1 of 16, 0.12 at c = 8 and 0.031 at c = 16, where
the choice costs several random-order steps: at text size the default chooser is a cheap confidence
heuristic, not a marginal. Where the predetermined step sums a TT's cores exactly (``contraction="exact"``,
or a temperature other than 1, whose sums the head does not predict), the chooser is the exact
marginal of the joint that step draws from (Eqs. 16-17 with every masked position summed, tempered), at the
cost of that exact sum.

Scores then rank positions as the chain rule's first pick does (fixed samplers: the ``counts`` best; EB:
positions by the error proxy, the largest prefix whose chooser entropies satisfy sum H - max H <= gamma, at
least one); the chain rule re-ranks after every pick with marginals conditional on the step's earlier picks,
this step does not.

What EB's rule is here: for independent draws from exact marginals, sum H - max H bounds the error of
drawing T from the product of its marginals instead of the joint (their total correlation). This step
computes it from the chooser's entropies, so it bounds nothing: it is a budget on the chooser's
uncertainty per step (a steps-against-quality dial), and at text size, where the chooser is far from the
marginal, the exact entropies of a chosen set can exceed gamma (the fourth review measured it in 7 of 24 steps,
by up to 1.67 at gamma 0.5). A joint draw does not make the error the rule bounds in any case.
"""

from dataclasses import dataclass

import torch

from ttcore.distributions import entry_rows, tempered

from ..constrained import constrained_joint
from ..eb import eb_accepts, eb_score
from ..orderings import ADAPTIVE, entropy
from .base import ConfiguredStep, WorkKind, eb_counts
from .settings import StepSettings, setting

CHOOSER_OUTPUTS = 2048  # values per masked position the choice may compute (c = this // V outputs): at a
# small backbone (QM9's) the float32 softmax and mixture over c * V values per position is what a step costs


def chooser_outputs(e: int, vocab: int, asked: int | None = None) -> int:
    """c, the head outputs per masked position the fast step evaluates: ``asked`` (a request's), else
    CHOOSER_OUTPUTS // V; in [1, E]."""
    return max(1, min(e, CHOOSER_OUTPUTS // vocab if asked is None else asked))


MAX_CHOOSER_OUTPUTS = 4096  # the most c a run may ask: V x r x r outputs of the text TT at r = 16 are 256 a position


@dataclass(frozen=True)
class ChooserSettings(StepSettings):
    """The fast step's own setting: its choice's head outputs per position."""
    chooser_outputs: int | None = setting(
        None, "`adaptive_path: fast`: the head outputs per masked position its choice evaluates (c). Default: "
              f"{CHOOSER_OUTPUTS} // V (every output at QM9's vocabulary, one at text's: about the cost of a "
              "random-order step). Larger c brings the choice's distributions to the head's full mixture (their "
              "distance to it is at most the dropped weight) at c times the cost; Benchmarks has the distance by c "
              "for each bundled checkpoint.", ge=1, le=MAX_CHOOSER_OUTPUTS)


def chooser_marginals(model, h: torch.Tensor, masked: torch.Tensor, temperature: float,
                      outputs: int | None = None, contraction: str = "head") -> torch.Tensor:
    """The distributions the fast step chooses by (module docstring): the exact marginals where the
    predetermined step sums the format's outputs exactly (TT: ``contraction="exact"`` or a temperature other
    than 1), else for each masked position the renormalized mixture of its c heaviest head outputs
    (``Decomposition.component_weights``; c = ``chooser_outputs(E, V, outputs)``), float32. -> [m, v],
    row-major over ``masked``."""
    fmt, head = model.format, model.head
    if fmt.sums_exactly(contraction, temperature, True, False):
        return fmt.marginals_at(head, h, masked, masked, temperature, contraction).float()
    weights = fmt.component_weights(head, h, masked, temperature)  # [m, E]
    m, e = weights.shape
    hm = h[masked]
    c = chooser_outputs(e, model.cfg.dit.out_vocab, outputs)
    if c == e:  # every output: one head pass over the masked positions
        top_w = weights
        logits = head.component_logits(hm)  # [m, e, v]
    else:  # the c heaviest outputs of each position
        top_w, top_e = weights.topk(c, dim=-1)  # [m, c]
        logits = head.gather_logits(hm, top_e)  # [m, c, v]
    q = torch.softmax(tempered(logits.float(), temperature, entry_rows(temperature, masked)), -1).view(m, c, -1)
    if c == 1:
        return q[:, 0]
    top_w = (top_w / top_w.sum(-1, keepdim=True).clamp_min(1e-300)).float()
    return (top_w[:, :, None] * q).sum(1)  # float32 (an einsum would run in bf16 under autocast)


class FastAdaptiveStep(ConfiguredStep):
    """Chooses the set of every sequence of its rows at once (``choose``: one chooser pass, each sequence's
    set from its own scores), then draws them as a predetermined step does. Its count is the schedule's, or
    EB's (``eb_gamma``: the largest prefix within the bound, decided by the choice)."""

    chooses = True  # holds c outputs per position, not the full joint
    constrains = True  # constrained rows: chosen by the constrained joint's exact marginals, drawn from it
    Settings = ChooserSettings

    def work_scale(self, model_cfg) -> float:
        """More chooser outputs than the default scale a chooser step's per-sequence cost by c over the
        default's: an upper bound (the backbone's share of a step does not grow with c)."""
        asked = self.settings.chooser_outputs
        if asked is None or self.work_kind(model_cfg.format) not in (WorkKind.chooser_step,
                                                                     WorkKind.tempered_chooser_step):
            return 1.0
        e, v = model_cfg.format.outputs_per_position(model_cfg.rank), model_cfg.dit.out_vocab
        return max(1.0, chooser_outputs(e, v, asked) / chooser_outputs(e, v))

    @classmethod
    def accepts(cls, config) -> bool:
        return (config.joint and config.adaptive_path == "fast"
                and (config.eb_gamma is not None or config.ordering in ADAPTIVE))

    def plan(self, run):
        return None  # chosen anew each step

    def counts(self, rows, n_current):
        return super().counts(rows, n_current) if self.config.eb_gamma is None else eb_counts(rows, n_current)

    def schedule_counts(self) -> bool:
        return self.config.eb_gamma is None


    def choose(self, rows, h, tokens, masked, counts) -> torch.Tensor:
        """This step's set T [b, l] bool: the best-scored masked positions by the chooser's marginals (the
        ``counts`` best, or EB's prefix where the count is -1)."""
        c = self.config
        if rows.automaton is not None:
            marg = constrained_marginals(rows.model, h, tokens, masked, rows.temperature, rows.automaton)
        else:
            marg = chooser_marginals(rows.model, h, masked, rows.temperature, self.settings.chooser_outputs,
                                     c.contraction)
        score_fn = ADAPTIVE[c.ordering] if c.eb_gamma is None else eb_score(c.eb_proxy)
        return choice_by_marginals(marg, masked, counts, score_fn, c.eb_gamma)


def constrained_marginals(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, temperature,
                          automaton) -> torch.Tensor:
    """The exact marginals of the constrained joint (``constrained.constrained_joint``) at the masked positions,
    float32. -> [m, v], row-major over ``masked``."""
    x_cond = torch.where(masked, torch.full_like(x, -1), x)
    return constrained_joint(model, h, x, masked, temperature, automaton).marginals(x_cond)[masked].float()


def choice_by_marginals(marg: torch.Tensor, masked: torch.Tensor, counts: torch.Tensor, score_fn,
                        eb_gamma: float | None) -> torch.Tensor:
    """A step's set T [b, l] bool chosen by the marginals ``marg`` [m, v] of the ``masked`` [b, l] positions
    (row-major): the ``counts`` [b] best by ``score_fn``, or where a count is -1 EB's largest prefix by it whose
    entropies satisfy sum H - max H <= ``eb_gamma`` (at least one)."""
    b, l = masked.shape
    score = torch.full((b, l), -float("inf"), dtype=torch.float64, device=masked.device)
    score[masked] = score_fn(marg).double()
    order = score.argsort(dim=-1, descending=True, stable=True)  # [b, l]
    rank = order.argsort(dim=-1, stable=True)
    if eb_gamma is not None:  # EB (-1 counts: not a last step): the largest prefix within the budget, >= 1
        ent = torch.zeros((b, l), dtype=torch.float64, device=masked.device)
        ent[masked] = entropy(marg).double()
        ent = torch.gather(ent, 1, order)  # [b, l] in rank order
        ok = eb_accepts(torch.where(torch.gather(masked, 1, order), ent, torch.zeros_like(ent)), eb_gamma)
        counts = torch.where(counts < 0, ok.cumprod(-1).sum(-1).clamp(min=1), counts)
    k = torch.minimum(counts, masked.sum(1))
    return (rank < k[:, None]) & masked
