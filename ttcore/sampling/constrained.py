"""Constrained steps: a run with a ``constraint`` (a ``ttcore.constraints.TokenDFA``) draws every step from the
model's joint over the whole sequence restricted to the automaton's language, p(x | x_t, x in L), exactly
(``ttcore.distributions.automaton.Constrained``): the step's set T is drawn jointly with the other masked positions
summed out through the automaton, by the same step classes (a predetermined set, the fast path's choice by the
constrained marginals, the chain rule and EB on the constrained joint). Every state a step reaches can still be
completed inside the language, so a run never dead-ends, and its finished sequences are accepted.

What "the model's joint" is here: the format's joint with every masked position's full head outputs (for TT its
cores, as ``contraction="exact"`` sums them; the contracted-core head has no per-token values to run the automaton
on), at the run's temperature."""

import torch

from ttcore.constraints import ConstraintError
from ttcore.distributions import Site, uniforms
from ttcore.distributions.automaton import (
    Automata,
    Constrained,
    conditioned_cores,
    constrained_sample,
    shared,
    targets,
)

from .joint_step import joint_distribution


def check_constraint(constraint, sampler, model, tokens: torch.Tensor, mask_id: int) -> None:
    """Raise ``ConstraintError`` unless the run's step class draws constrained rows, the model's format has a
    chain joint (``Decomposition.chains``), the automaton reads the model's tokens, and some accepted sequence
    agrees with every row of ``tokens`` (its prompt)."""
    vocab = model.cfg.dit.out_vocab
    if constraint.vocab_size != vocab:
        raise ConstraintError(f"the automaton reads {constraint.vocab_size} tokens, the model has {vocab}")
    if not sampler.constrains:
        raise ConstraintError(f"the {type(sampler).__name__} sampler does not draw constrained steps (joint: false "
                              "draws each position alone, which no automaton can steer)")
    if not model.format.chains:
        raise ConstraintError(f"the {model.format.name} format's joint is not a chain: no automaton can restrict it")
    template = torch.where(tokens == mask_id, torch.full_like(tokens, -1), tokens).cpu()
    if not all(constraint.admits(row) for row in template.unique(dim=0)):  # kept with the automaton
        raise ConstraintError("no sequence of the model's length that agrees with the prompt is in the language")


def batch_automaton(constraints: list, sizes: list[int], device) -> Automata:
    """The automata of runs stepped together, one row per sequence, over each one's token classes
    (``TokenDFA.classes``): Q and C the largest, the smaller padded with rejecting states and empty classes. Runs
    of one automaton share its tables (expanded, not copied: the messages reckon them once)."""
    q = max(c.num_states for c in constraints)
    k = max(c.classes[1].shape[1] for c in constraints)
    deltas, accepting, token_class = [], [], []
    for c, n in zip(constraints, sizes):
        cls, d = c.classes
        d = torch.cat([d, d.new_full((d.shape[0], k - d.shape[1]), -1)], 1)
        d = torch.cat([d, d.new_full((q - d.shape[0], k), -1)])
        a = torch.cat([c.accepting, torch.zeros(q - c.num_states, dtype=torch.bool)])
        deltas.append(d.to(device).expand(n, -1, -1))
        accepting.append(a.to(device).expand(n, -1))
        token_class.append(cls.to(device).expand(n, -1))
    if all(c is constraints[0] for c in constraints):
        total = sum(sizes)
        return Automata(*(t[0][:1].expand(total, *t[0].shape[1:]) for t in (deltas, accepting, token_class)))
    return Automata(torch.cat(deltas), torch.cat(accepting), torch.cat(token_class))


def constrained_joint(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, temperature, automaton
                      ) -> Constrained:
    """p(x | x_t, x in L) of these rows: the format's joint (``joint_step.joint_distribution``: a TT's and CP's in
    float32, a rank-1 model's in float64) times the rows' automata (known tokens move them by a gather)."""
    known = torch.where(masked, torch.full_like(x, -1), x)
    return Constrained(joint_distribution(model, h, x, masked, temperature), automaton, known)


def block_automaton(automata: Automata, tokens: torch.Tensor, start: torch.Tensor, size: int) -> Automata:
    """The automata of the block at positions start .. start + size - 1 of each row (``start`` [b]): started in
    the state the row's tokens before the block lead to (``Automata.start``), and accepting in the states from
    which the whole automaton can still accept in the positions after the block (every one masked: a block
    model's rows), so a draw of the block from its joint restricted to this language is one that some accepted
    sequence continues (``ttcore.sampling.steps.block``). Rows of one automaton (``delta`` expanded, as
    ``batch_automaton`` gives a constraint's runs) share the accepting sets' work."""
    delta, token_class = automata.delta, automata.token_class
    b, q_n, _ = delta.shape
    rows = torch.arange(b, device=delta.device)
    q = automata.initial
    for i in range(int(start.max())):  # the prefix's state (it is feasible: the run's draws kept it so)
        on = i < start  # rows whose block starts later (a row's position i past its start may be a [MASK])
        nxt = delta[rows, q.clamp_min(0), token_class[rows, torch.where(on, tokens[:, i], 0).clamp_min(0)]]
        q = torch.where(on, nxt, q)
    left = tokens.shape[1] - start - size  # [b] positions after the block
    one = shared(delta) and shared(automata.accepting)
    to = targets(delta[:1] if one else delta).flatten(1)  # [b or 1, Q C]
    co = automata.accepting[:1] if one else automata.accepting
    ahead = [co]  # ahead[j]: the states that can accept in exactly j more tokens
    for _ in range(int(left.max())):
        co = torch.cat([co, co.new_zeros(co.shape[0], 1)], 1).gather(1, to).view(co.shape[0], q_n, -1).any(2)
        ahead.append(co)
    ahead = torch.stack(ahead, 1)  # [b or 1, n + 1, Q]
    return Automata(delta, ahead[0 if one else rows, left], token_class, q)


FLOOR = 1e-300  # the float64 weight a rescued row gives a value its joint rounded to 0 (``constrained_step``)


def constrained_step(model, h: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
                     temperature, generator, automaton) -> torch.Tensor:
    """A joint draw of x_T, T = ``chosen``, from p(x_T | x_t, x in L) (one accepted completion of every masked
    position drawn, T kept). A row whose joint gives every accepted completion zero mass (the text TT's float32
    cores round end-of-text mid-sequence, about 1e-50, to 0, and a short regex needs padding there) draws again
    in float64 with the joint's zeros raised to ``FLOOR``: the model's own weights wherever it has any, so the run
    neither dead-ends nor leaves its language (the known tokens' feasibility was checked when the run began).
    -> [b, l], -1 off T."""
    if not chosen.any():
        return torch.full_like(x, -1)
    dist = constrained_joint(model, h, x, masked, temperature, automaton)
    values = dist.sample(chosen, generator)
    lost = (values == -1).all(1) & chosen.any(1)
    if lost.any():
        known = dist.known[lost]
        cores = conditioned_cores(dist.cores[lost].double().clamp_min(FLOOR), known)
        u = uniforms(generator, x.shape[0], 2 * x.shape[1] + 1, x.device, Site.draw)[lost]
        path = constrained_sample(dist.start[lost].double(), cores, automaton[lost], u, dist.diagonal, known=known)
        values[lost] = torch.where(chosen[lost], path, torch.full_like(path, -1))
    return values
