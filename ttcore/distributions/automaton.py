"""A chain joint times a deterministic finite automaton over its tokens: the joint restricted to the sequences the
automaton accepts, exactly normalized, marginalized and sampled.

Every format is a chain over the positions, p(x) = s^T G_1(x^1) ... G_l(x^l) 1: a Tensor-Train's cores
G_i(x) [r, r] with the uniform start s = 1/r (Eq. 9), CP's diagonal diag_a f_{i,a}(x) with its weights as the
start (Eq. 6), rank 1 the r = 1 case (Eq. 2); a known position's core is delta(x = token) I. A deterministic
automaton (states Q, start q_0, accepting F, transitions delta(q, x), -1 where it rejects) is a chain of 0/1
matrices P(x)[q, q'] = 1[delta(q, x) = q']. Their product G_i(x) (x) P(x) is again a chain, of rank r |Q|, so

    p(x | x in L) = s^T (G_1(x^1) (x) P(x^1)) ... (G_l(x^l) (x) P(x^l)) (1 (x) 1_F) / Z,   Z = p(x in L),

and the messages of a hidden Markov chain give it exactly (with respect to the chain given: a TT's full cores,
so its unchosen positions are summed exactly, not by the contracted-core head): ``backward_messages``
beta_i[a, q] (the mass of every accepted continuation after position i from rank state a and automaton state
q), ``log_acceptance`` log Z, ``constrained_marginals`` p(x^i | x in L), and ``constrained_sample``, a draw of
the whole sequence from p(x | x in L) by ancestral sampling of the product chain's path (its restriction to a
set T is a draw of x_T with the other positions summed out). Since every step of the path keeps a positive
message ahead, every prefix it draws can still be completed to an accepted sequence.

The transitions are per row (``delta`` [b, Q, V]: a batch mixes automata, padded to one Q with rejecting
states); the work is O(l V r^2 |Q|) a sequence (dense cores; O(l V r |Q|) diagonal), in float64, each message
scaled to max 1 with its log scale carried.
"""

import torch

from ._precision import own_precision
from .categorical import sample_categorical
from .streams import Site, uniforms


def _gather_ahead(beta: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """beta [b, r, Q] at delta(q, x): [b, r, Q, V], 0 where delta rejects (-1)."""
    b, r, q_n = beta.shape
    padded = torch.cat([beta, beta.new_zeros(b, r, 1)], -1)  # column Q: the rejecting sink, mass 0
    idx = torch.where(delta < 0, q_n, delta)  # [b, Q, V]
    v = delta.shape[-1]
    return padded.gather(2, idx.reshape(b, 1, q_n * v).expand(b, r, q_n * v)).view(b, r, q_n, v)


def _step_back(core: torch.Tensor, ahead: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """sum_x G(x) beta(delta(q, x)): core [b, V, r, r] (diagonal: [b, V, r]), ahead [b, r, Q, V] -> [b, r, Q]."""
    if diagonal:
        return torch.einsum("nva,naqv->naq", core, ahead)
    return torch.einsum("nvac,ncqv->naq", core, ahead)


def _scaled(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """m / max per row (rows of zeros stay zero) -> (scaled, log max [b])."""
    top = m.flatten(1).amax(1).clamp_min(torch.finfo(m.dtype).tiny)
    return m / top.view(-1, *([1] * (m.dim() - 1))), top.log()


@own_precision
def backward_messages(cores: torch.Tensor, delta: torch.Tensor, accepting: torch.Tensor, diagonal: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """beta_i[a, q] for i = 0..l: beta_l = 1[q in F], beta_{i-1}[a, q] = sum_x sum_c G_i(x)[a, c] beta_i[c,
    delta(q, x)] (0-based: beta_i is what lies after position i - 1). cores [b, l, V, r, r] (diagonal: [b, l, V,
    r]), delta [b, Q, V] long, accepting [b, Q] bool -> (beta [b, l + 1, r, Q] each scaled to max 1, log scales
    [b, l + 1]: the true message is beta_i exp(sum of the scales from i to l))."""
    b, l, _, r = cores.shape[:4]
    beta = accepting[:, None, :].to(cores.dtype).expand(b, r, -1)
    out, scales = [beta], [cores.new_zeros(b)]
    for i in range(l - 1, -1, -1):
        beta, scale = _scaled(_step_back(cores[:, i], _gather_ahead(beta, delta), diagonal))
        out.append(beta)
        scales.append(scale)
    return torch.stack(out[::-1], 1), torch.stack(scales[::-1], 1)


def log_acceptance(start: torch.Tensor, cores: torch.Tensor, delta: torch.Tensor, accepting: torch.Tensor,
                   initial: torch.Tensor, diagonal: bool = False) -> torch.Tensor:
    """log Z = log p(x in L) = log sum_a s_a beta_0[a, q_0]: start [b, r], initial q_0 [b] -> [b] (-inf: no
    sequence the chain can emit is accepted)."""
    beta, scales = backward_messages(cores, delta, accepting, diagonal)
    first = beta[:, 0].gather(2, initial.view(-1, 1, 1).expand(-1, beta.shape[2], 1))[..., 0]  # [b, r]
    return (start.to(beta.dtype) * first).sum(1).log() + scales.sum(1)


@own_precision
def constrained_marginals(start: torch.Tensor, cores: torch.Tensor, delta: torch.Tensor, accepting: torch.Tensor,
                          initial: torch.Tensor, diagonal: bool = False) -> torch.Tensor:
    """p(x^i = x | x in L) for every position: the forward messages F_i[a, q] (the prefix's mass ending in rank
    state a, automaton state q) times each token's core and the backward message after it, normalized over x.
    -> [b, l, V] (rows of zeros where nothing is accepted)."""
    b, l, v, r = cores.shape[:4]
    q_n = delta.shape[1]
    beta, _ = backward_messages(cores, delta, accepting, diagonal)
    fwd = torch.zeros(b, r, q_n, dtype=cores.dtype, device=cores.device)
    fwd[torch.arange(b), :, initial] = start.to(cores.dtype)
    out = []
    idx = torch.where(delta < 0, q_n, delta).reshape(b, 1, q_n * v)
    for i in range(l):
        if diagonal:  # contribution[n, c, q, x]: into rank state c and automaton state delta(q, x) by token x
            contribution = torch.einsum("naq,nva->naqv", fwd, cores[:, i])
        else:
            contribution = torch.einsum("naq,nvac->ncqv", fwd, cores[:, i])
        joint = (contribution * _gather_ahead(beta[:, i + 1], delta)).sum((1, 2))  # [b, V]
        out.append(joint / joint.sum(-1, keepdim=True).clamp_min(torch.finfo(joint.dtype).tiny))
        moved = torch.zeros(b, r, q_n + 1, dtype=cores.dtype, device=cores.device)
        moved.scatter_add_(2, idx.expand(b, r, -1), contribution.reshape(b, r, q_n * v))
        fwd = _scaled(moved[..., :q_n])[0]
    return torch.stack(out, 1)


@own_precision
def constrained_sample(start: torch.Tensor, cores: torch.Tensor, delta: torch.Tensor, accepting: torch.Tensor,
                       initial: torch.Tensor, u: torch.Tensor, diagonal: bool = False) -> torch.Tensor:
    """One draw of the whole sequence from p(x | x in L) per row, by the product chain's path: the rank state
    a_0 ~ s_a beta_0[a, q_0], then at each position i the token and next rank state (x, c) ~ G_i(x)[a, c]
    beta_{i+1}[c, delta(q, x)] (diagonal: c = a), q <- delta(q, x). u [b, l + 1] float64 uniforms (lane 0 the
    start, lane i + 1 position i). -> [b, l] long; -1 in rows where nothing is accepted (Z = 0)."""
    b, l, v, r = cores.shape[:4]
    beta, _ = backward_messages(cores, delta, accepting, diagonal)
    rows = torch.arange(b, device=cores.device)
    q = initial.clone()
    w0 = start.to(cores.dtype) * beta[rows, 0, :, q]  # [b, r]
    ok = w0.sum(1) > 0
    a = sample_categorical(w0, u=u[:, 0])
    out = torch.empty(b, l, dtype=torch.long, device=cores.device)
    for i in range(l):
        nxt = delta[rows, q]  # [b, V]
        ahead = torch.cat([beta[:, i + 1], beta.new_zeros(b, r, 1)], -1)  # [b, r, Q + 1]
        at = ahead.gather(2, torch.where(nxt < 0, ahead.shape[-1] - 1, nxt)[:, None, :].expand(b, r, v))  # [b, r, V]
        if diagonal:
            w = cores[rows, i, :, a] * at[rows, a]  # [b, V]
            x, c = sample_categorical(w, u=u[:, i + 1]), a
        else:
            w = cores[rows, i, :, a, :] * at.transpose(1, 2)  # [b, V, r]: G_i(x)[a, c] beta(c, delta(q, x))
            flat = sample_categorical(w.reshape(b, v * r), u=u[:, i + 1])
            x, c = flat // r, flat % r
        out[:, i] = x
        q, a = nxt[rows, x].clamp_min(0), c
    return torch.where(ok[:, None], out, torch.full_like(out, -1))


def as_chain(joint) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A format's joint as a chain s^T G_1(x^1) ... G_l(x^l) 1: (start [b, r], cores, diagonal). A Tensor-Train
    (``cores`` [b, l, v, r, r]: s = 1/r, dense), CP (``weights`` [b, r], ``factors`` [b, l, r, v]: diagonal
    cores [b, l, v, r]) or factorized (``probs`` [b, l, v]: r = 1)."""
    if hasattr(joint, "cores"):
        b, r = joint.cores.shape[0], joint.cores.shape[-1]
        return joint.cores.new_full((b, r), 1.0 / r), joint.cores, False
    if hasattr(joint, "factors"):
        return joint.weights, joint.factors.transpose(2, 3), True
    return joint.probs.new_ones(joint.probs.shape[0], 1), joint.probs[..., None], True


class Constrained:
    """p(x | x in L): a joint (``Factorized``, ``CP``, ``TensorTrain``) restricted to the sequences a deterministic
    automaton accepts, per row (``delta`` [b, Q, v] long with -1 for rejection, ``accepting`` [b, Q] bool, start
    state 0), normalized exactly; a ``JointDistribution`` itself, so the samplers' chain rule and joint draws run on
    it unchanged. Conditioning on x_S multiplies each conditioned position's core by the indicator of its token."""

    def __init__(self, joint, delta: torch.Tensor, accepting: torch.Tensor):
        self.joint = joint
        self.start, self.cores, self.diagonal = as_chain(joint)
        self.delta, self.accepting = delta, accepting
        self.b, self.l, self.v = self.cores.shape[0], self.cores.shape[1], self.cores.shape[2]
        self.initial = torch.zeros(self.b, dtype=torch.long, device=delta.device)

    def _conditioned(self, x_cond: torch.Tensor) -> torch.Tensor:
        """The cores with each conditioned position's other tokens zeroed."""
        keep = torch.nn.functional.one_hot(x_cond.clamp_min(0), self.v).to(torch.bool) | (x_cond < 0)[..., None]
        shape = keep.shape + (1,) * (self.cores.dim() - 3)
        return self.cores * keep.view(shape).to(self.cores.dtype)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x | x in L) of complete sequences x [b, l]: log p(x) - log Z where accepted, -inf elsewhere."""
        accepted = self.accepts(x)
        z = log_acceptance(self.start, self.cores, self.delta, self.accepting, self.initial, self.diagonal)
        lp = self.joint.log_prob(x).to(z.dtype) - z
        return torch.where(accepted, lp, torch.full_like(lp, -torch.inf))

    def accepts(self, x: torch.Tensor) -> torch.Tensor:
        """Whether the automaton of each row accepts its complete sequence x [b, l]. -> [b] bool."""
        rows = torch.arange(self.b, device=x.device)
        q = self.initial.clone()
        for i in range(self.l):
            q = torch.where(q >= 0, self.delta[rows, q.clamp_min(0), x[:, i]], q)
        return (q >= 0) & self.accepting[rows, q.clamp_min(0)]

    def log_normalizer(self, x_cond: torch.Tensor | None = None) -> torch.Tensor:
        """log p(x in L, x_S) [b]: -inf where no accepted sequence agrees with x_cond (None: nothing known)."""
        cores = self.cores if x_cond is None else self._conditioned(x_cond)
        return log_acceptance(self.start, cores, self.delta, self.accepting, self.initial, self.diagonal)

    def marginals(self, x_cond: torch.Tensor) -> torch.Tensor:
        """p(x^i | x_S, x in L) [b, l, v], one-hot at the conditioned positions."""
        return constrained_marginals(self.start, self._conditioned(x_cond), self.delta, self.accepting,
                                     self.initial, self.diagonal)

    def sample(self, positions: torch.Tensor | None = None, generator=None) -> torch.Tensor:
        """One draw of x_T from p(x_T | x in L), T = ``positions`` [b, l] (all when None), the other positions
        summed out (a whole accepted sequence is drawn, its T kept); uniforms: lanes 0..l of ``Site.draw``.
        -> [b, l], -1 off T (and in rows where nothing is accepted)."""
        u = uniforms(generator, self.b, self.l + 1, self.cores.device, Site.draw)
        x = constrained_sample(self.start, self.cores, self.delta, self.accepting, self.initial, u, self.diagonal)
        return x if positions is None else torch.where(positions, x, torch.full_like(x, -1))
