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
q), ``log_acceptance`` log Z (the accepted mass over the chain's total, ``chain_log_total``: a tempered
train is not normalized), ``constrained_marginals`` p(x^i | x in L), and ``constrained_sample``, a draw of
the whole sequence from p(x | x in L) by ancestral sampling of the product chain's path (its restriction to a
set T is a draw of x_T with the other positions summed out). Since every step of the path keeps a positive
message ahead, every prefix it draws can still be completed to an accepted sequence.

Tokens that move every state alike form a class (``Automata``: an automaton's transitions over C classes, and
each token's class): the messages need only the class sums of the cores, sum_{x in k} G_i(x), so their work is
O(l C r^2 |Q|) a sequence (dense cores; O(l C r |Q|) diagonal) plus O(l V r^2) for the sums, in the cores' dtype, each
message scaled to max 1 with its log scale carried; a draw picks the class and the next rank state from the
messages, then the token within the class from its own core. A batch mixes automata, padded to one Q (rejecting
states) and one C (classes no token is in).
"""

from dataclasses import dataclass

import torch

from ._precision import own_precision
from .categorical import sample_categorical
from .streams import Site, uniforms


@dataclass
class Automata:
    """One automaton per row over token classes: ``delta`` [b, Q, C] long (the next state, -1: rejected),
    ``accepting`` [b, Q] bool, ``token_class`` [b, V] long (each token's class), ``start`` [b] long (each row's
    start state; None: state 0). Rows of one automaton may share its tensors (expanded: stride 0 over rows)."""
    delta: torch.Tensor
    accepting: torch.Tensor
    token_class: torch.Tensor
    start: torch.Tensor | None = None

    @classmethod
    def of_tokens(cls, delta: torch.Tensor, accepting: torch.Tensor) -> "Automata":
        """From transitions over the tokens themselves, delta [b, Q, V]: each row's classes are its distinct columns
        (``token_classes``), padded to the batch's largest count."""
        parts = [token_classes(d) for d in delta]
        c = max(p[1].shape[1] for p in parts)
        pad = [torch.cat([d, d.new_full((d.shape[0], c - d.shape[1]), -1)], 1) for _, d in parts]
        return cls(torch.stack(pad), accepting, torch.stack([k for k, _ in parts]))

    def __getitem__(self, index) -> "Automata":
        n = torch.arange(self.delta.shape[0], device=self.delta.device)[index].numel()

        def rows(t):  # a shared tensor stays shared
            return t[:1].expand(n, *t.shape[1:]) if shared(t) else t[index]
        return Automata(rows(self.delta), rows(self.accepting), rows(self.token_class),
                        None if self.start is None else self.start[index])

    @property
    def initial(self) -> torch.Tensor:
        """Each row's start state [b] long."""
        if self.start is not None:
            return self.start
        return torch.zeros(self.delta.shape[0], dtype=torch.long, device=self.delta.device)

    @property
    def num_classes(self) -> int:
        return self.delta.shape[-1]


def token_classes(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The classes of an automaton's tokens (tokens whose columns of delta [Q, V] are equal): -> (token_class [V],
    the transitions over the classes [Q, C])."""
    columns, token_class = torch.unique(delta.T, dim=0, return_inverse=True)
    return token_class, columns.T.contiguous()


MATMUL_CLASSES = 32  # ``class_sums``: at most this many classes sum by a matmul


def class_sums(cores: torch.Tensor, automata: Automata) -> torch.Tensor:
    """sum_{x in k} G_i(x) per class k: cores [b, l, V, ...] -> [b, l, C, ...]. With few classes (``MATMUL_CLASSES``)
    and one class table for all rows (``shared``), one matmul by the class indicator [C, V]: its C multiplies a
    value cost less than a scatter's one add (3-4x faster at C = 8-10, 2x at 40, level at 64: one CPU thread)."""
    b, l, v = cores.shape[:3]
    c_n = automata.num_classes
    if c_n <= MATMUL_CLASSES and shared(automata.token_class):
        member = torch.nn.functional.one_hot(automata.token_class[0], c_n).to(cores.dtype).T  # [C, V]
        return (member @ cores.reshape(b, l, v, -1)).view(b, l, c_n, *cores.shape[3:])
    index = automata.token_class.view(b, 1, v, *([1] * (cores.dim() - 3))).expand_as(cores)
    out = cores.new_zeros(b, l, c_n, *cores.shape[3:])
    return out.scatter_add_(2, index, cores)


def _gather_ahead(beta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """beta [b, r, Q] at delta(q, k): [b, r, Q, C], 0 where delta rejects; ``idx`` [b, 1, Q C] the flattened
    ``targets`` of delta (Q: the rejecting sink, a zero column appended here)."""
    b, r, q_n = beta.shape
    padded = torch.cat([beta, beta.new_zeros(b, r, 1)], -1)
    return padded.gather(2, idx.expand(b, r, -1)).view(b, r, q_n, -1)


def shared(t: torch.Tensor) -> bool:
    """Whether the rows of ``t`` are one row expanded (stride 0: ``batch_automaton``'s runs of one constraint)."""
    return t.shape[0] > 1 and t.stride(0) == 0


def per_row(t: torch.Tensor, fn) -> torch.Tensor:
    """fn(t) of a per-row tensor; of a ``shared`` one, fn of its one row, expanded again over the rows."""
    if not shared(t):
        return fn(t)
    one = fn(t[:1])
    return one.expand(t.shape[0], *one.shape[1:])


def targets(delta: torch.Tensor) -> torch.Tensor:
    """delta [b, Q, C] with the rejections (-1) sent to Q, a zero row callers append."""
    return per_row(delta, lambda d: torch.where(d < 0, d.shape[1], d))


def _scaled(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """m / max per row (rows of zeros stay zero) -> (scaled, log max [b])."""
    top = m.flatten(1).amax(1).clamp_min(torch.finfo(m.dtype).tiny)
    return m / top.view(-1, *([1] * (m.dim() - 1))), top.log()


def _back(summed_i: torch.Tensor, beta: torch.Tensor, idx: torch.Tensor, diagonal: bool,
          live: torch.Tensor | None = None) -> torch.Tensor:
    """sum_k sum_c G(k)[a, c] beta[delta(q, k), c]: class sums laid out for the matmul, [n, C r, r] with rows (k, c)
    and columns a (``_by_class_and_next``; diagonal: [n, C, r]), beta [n, Q, r], ``idx`` [n, Q, C] the rows of beta
    padded with a zero row (Q: rejected) that delta leads to -> [n, Q, r]: one gather of whole rank vectors (one
    index for rows that share an automaton) and one batched matmul over (k, c), for the ``live`` states only (the
    others 0)."""
    n, q_n, r = beta.shape
    one = shared(idx)
    padded = torch.cat([beta, beta.new_zeros(n, 1, r)], 1)
    at = idx[:1] if one else idx
    at = at if live is None else at[:, live]  # [n or 1, Ql, C]
    q_l, c_n = at.shape[1:]
    if one:
        ahead = padded.index_select(1, at[0].flatten())  # [n, Ql C, r]
    else:
        ahead = padded[torch.arange(n, device=beta.device)[:, None], at.reshape(n, -1)]
    if diagonal:  # c = a
        out = (ahead.view(n, q_l, c_n, r) * summed_i[:, None]).sum(2)
    else:
        out = torch.bmm(ahead.view(n, q_l, c_n * r), summed_i)
    if live is None:
        return out
    full = beta.new_zeros(n, q_n, r)
    full[:, live] = out
    return full


def _by_class_and_next(summed: torch.Tensor) -> torch.Tensor:
    """Class sums [b, l, C, r, r] ([k, a, c]) as ``_back``'s matmul reads them, [b, l, C r, r] ([(k, c), a]): one
    copy for every position."""
    b, l, c_n, r, _ = summed.shape
    return summed.transpose(-1, -2).reshape(b, l, c_n * r, r)


def live_states(automata: Automata, known: torch.Tensor | None, l: int) -> torch.Tensor:
    """[l + 1, Q] bool: the states some row's automaton can be in after i tokens that agree with its known tokens
    and from which it can still accept in the l - i tokens left (agreeing with them too); the messages of every
    other state are unused (the path never visits them) or zero (they cannot accept), so ``backward_messages``
    computes these only. Boolean reachability, O(l Q C) a row.

    Rows of one automaton (``delta`` expanded, as ``batch_automaton`` gives runs of one constraint) are reckoned
    once, over the union of their start states, allowed classes and accepting states: a superset of the rows'
    sets that keeps every message exact. A state q it keeps reads, in each row, beta at delta(q, k) for the classes
    that row allows, all in the union's next set; one of those the superset drops cannot reach the union's
    accepting states, so no row can accept from it and its true message is 0, what the messages hold for it."""
    b, q_n, c_n = automata.delta.shape
    union = shared(automata.delta)
    to = targets(automata.delta[:1] if union else automata.delta).flatten(1)  # [b or 1, Q C]
    rows = torch.arange(b, device=to.device)
    allowed = []  # [b, C] per position: the classes its token may take
    for i in range(l):
        every = torch.ones(b, c_n, dtype=torch.bool, device=to.device)
        if known is not None and (known[:, i] >= 0).any():
            fixed = known[:, i] >= 0
            one = torch.zeros_like(every)
            one[rows, automata.token_class[rows, known[:, i].clamp_min(0)]] = True
            every = torch.where(fixed[:, None], one, every)
        allowed.append(every)
    reach = torch.zeros(b, q_n + 1, device=to.device)
    reach[rows, automata.initial] = 1
    co = automata.accepting.clone()
    if union:  # one row: the unions (docstring)
        reach, co, allowed, b = reach.amax(0, keepdim=True), co.any(0, keepdim=True), \
            [a.any(0, keepdim=True) for a in allowed], 1
    forward = [reach[:, :q_n] > 0]
    for i in range(l):
        hit = (forward[-1][:, :, None] & allowed[i][:, None, :]).reshape(b, -1)
        reach = torch.zeros(b, q_n + 1, device=to.device).scatter_add_(1, to, hit.float())
        forward.append(reach[:, :q_n] > 0)
    backward = [co]
    for i in range(l - 1, -1, -1):
        ahead = torch.cat([co, torch.zeros(b, 1, dtype=torch.bool, device=co.device)], 1).gather(1, to)
        co = (ahead.view(b, q_n, c_n) & allowed[i][:, None, :]).any(2)
        backward.append(co)
    backward = backward[::-1]
    return torch.stack([(f & c).any(0) for f, c in zip(forward, backward)])


def live_automata(automata: Automata, known: torch.Tensor | None, l: int) -> tuple[Automata, torch.Tensor]:
    """The automata restricted to the states ``live_states`` keeps at some position, renumbered in order, and
    that table over them: (automata [b, Q', C], live [l + 1, Q']). A transition into a dropped state rejects:
    exact, since no row can accept from it (``live_states``: a kept state's successor it drops has message 0
    at that position). A row whose start state is dropped accepts nothing: its start is -1. The messages then
    run over Q' states, not Q (a block's four positions from known start states reach a few dozen of QM9's
    grammar's 706)."""
    live = live_states(automata, known, l)
    keep = live.any(0)
    if bool(keep.all()):
        return automata, live
    if not bool(keep.any()):  # no row accepts anything: one state kept (its messages 0), so nothing is empty
        keep[0] = True
    q_n = keep.shape[0]
    new = torch.full((q_n + 1,), -1, dtype=torch.long, device=keep.device)  # old state (Q: rejected) -> new
    new[keep.nonzero()[:, 0]] = torch.arange(int(keep.sum()), device=keep.device)
    delta = per_row(automata.delta, lambda d: new[targets(d)[:, keep]])  # a rejection (Q) stays one (-1)
    accepting = per_row(automata.accepting, lambda a: a[:, keep])
    return Automata(delta, accepting, automata.token_class, new[automata.initial]), live[:, keep]


@own_precision
def backward_messages(summed: torch.Tensor, automata: Automata, diagonal: bool = False,
                      known: torch.Tensor | None = None, live: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """beta_i[q, a] for i = 0..l: beta_l = 1[q in F], beta_{i-1}[q, a] = sum_k sum_c G_i(k)[a, c]
    beta_i[delta(q, k), c] (0-based: beta_i is what lies after position i - 1). ``summed``: the class sums of the
    cores (``class_sums``) [b, l, C, r, r] (diagonal: [b, l, C, r]); ``known`` [b, l] (optional): the token of each
    position whose core is delta(x = token) I (-1 elsewhere), whose message is a gather, no matmul. -> (beta
    [b, l + 1, Q, r] each scaled to max 1, log scales [b, l + 1]: the true message is beta_i exp(sum of the scales
    from i to l))."""
    b, l, _, r = summed.shape[:4]
    q_n = automata.delta.shape[1]
    idx = targets(automata.delta)  # [b, Q, C]
    if live is None:  # [l + 1, Q]: the states whose messages anything reads (``live_automata`` gives both)
        live = live_states(automata, known, l)
    rows = torch.arange(b, device=summed.device)
    beta = automata.accepting[:, :, None].to(summed.dtype).expand(b, -1, r).contiguous()
    out, scales = [beta], [summed.new_zeros(b)]
    summed = summed if diagonal else _by_class_and_next(summed)
    for i in range(l - 1, -1, -1):
        fixed = None if known is None else known[:, i] >= 0
        if fixed is None or not fixed.any():
            new = _back(summed[:, i], beta, idx, diagonal, live[i])
        else:
            new = torch.empty_like(beta)
            f = rows[fixed]  # a known token moves every state by its class: a gather of rows
            dest = automata.delta[f, :, automata.token_class[f, known[f, i]]]  # [f, Q]
            padded = torch.cat([beta[f], beta.new_zeros(len(f), 1, r)], 1)
            new[f] = padded[torch.arange(len(f), device=beta.device)[:, None], torch.where(dest < 0, q_n, dest)]
            m = rows[~fixed]
            if len(m):
                new[m] = _back(summed[m, i], beta[m], idx[m], diagonal, live[i])
        beta, scale = _scaled(new)
        out.append(beta)
        scales.append(scale)
    return torch.stack(out[::-1], 1), torch.stack(scales[::-1], 1)


def chain_log_total(start: torch.Tensor, summed: torch.Tensor, diagonal: bool = False) -> torch.Tensor:
    """log of the chain's total mass, log s^T (sum_x G_1(x)) ... (sum_x G_l(x)) 1, from the class sums [b, l, C,
    ...] (every token is in one class): 0 for a normalized joint (a row-stochastic train, CP, rank 1), not for a
    tempered train, whose entries G(x)^(1/T) (each position shifted by its own maximum) are not row-stochastic.
    Each product rescaled to max 1, its log carried. -> [b]."""
    totals = summed.sum(2)  # [b, l, r, r] (diagonal [b, l, r])
    v = totals.new_ones(totals.shape[0], totals.shape[-1])  # [b, r]
    log_scale = totals.new_zeros(totals.shape[0])
    for i in range(totals.shape[1] - 1, -1, -1):
        v = totals[:, i] * v if diagonal else (totals[:, i] @ v[..., None])[..., 0]
        top = v.amax(1).clamp_min(torch.finfo(v.dtype).tiny)
        v, log_scale = v / top[:, None], log_scale + top.log()
    return (start.to(v.dtype) * v).sum(1).log() + log_scale


def log_accepted_mass(start: torch.Tensor, summed: torch.Tensor, automata: Automata, diagonal: bool = False,
                      known: torch.Tensor | None = None) -> torch.Tensor:
    """log sum_{x in L} s^T G_1(x^1) ... G_l(x^l) 1 = log sum_a s_a beta_0[a, q_0], the chain's accepted mass
    as its entries stand (unnormalized for a tempered train): start [b, r], the class sums -> [b] (-inf: nothing
    the chain can emit is accepted)."""
    automata, live = live_automata(automata, known, summed.shape[1])
    beta, scales = backward_messages(summed, automata, diagonal, known, live)
    return (start.to(beta.dtype) * _at_start(beta, automata)).sum(1).log() + scales.sum(1)


def _at_start(beta: torch.Tensor, automata: Automata) -> torch.Tensor:
    """beta_0 at each row's start state [b, r]: 0 where it has none left (``live_automata``: nothing accepted)."""
    q = automata.initial
    at = beta[torch.arange(beta.shape[0], device=beta.device), 0, q.clamp_min(0)]
    return at * (q >= 0)[:, None]


def log_acceptance(start: torch.Tensor, summed: torch.Tensor, automata: Automata, diagonal: bool = False
                   ) -> torch.Tensor:
    """log Z = log p(x in L): the accepted mass over the chain's total (``chain_log_total``), a log-probability at
    every temperature and for every row alone, whatever the batch's other rows are. start [b, r], the class sums
    -> [b] (-inf: no sequence the chain can emit is accepted)."""
    return log_accepted_mass(start, summed, automata, diagonal) - chain_log_total(start, summed, diagonal)


@own_precision
def constrained_marginals(start: torch.Tensor, cores: torch.Tensor, automata: Automata, diagonal: bool = False
                          ) -> torch.Tensor:
    """p(x^i = x | x in L) for every position: the forward messages F_i[a, q] (the prefix's mass ending in rank
    state a, automaton state q), W_i[k][a, c] = sum_q F_i[a, q] beta_{i+1}[c, delta(q, k)] per class, and each
    token's p(x) ~ sum_{a, c} G_i(x)[a, c] W_i[class(x)][a, c], normalized over x. cores [b, l, V, r, r]
    (diagonal [b, l, V, r]) -> [b, l, V] (rows of zeros where nothing is accepted)."""
    b, l, v, r = cores.shape[:4]
    c_n = automata.delta.shape[2]
    summed = class_sums(cores, automata)
    automata, live = live_automata(automata, None, l)
    q_n = automata.delta.shape[1]
    beta, _ = backward_messages(summed, automata, diagonal, None, live)
    fwd = torch.zeros(b, r, q_n + 1, dtype=cores.dtype, device=cores.device)  # column Q: rows accepting nothing
    q0 = automata.initial
    fwd[torch.arange(b, device=cores.device), :, torch.where(q0 < 0, q_n, q0)] = start.to(cores.dtype)
    fwd = fwd[..., :q_n]
    out = []
    idx = targets(automata.delta).reshape(b, 1, q_n * c_n)
    tiny = torch.finfo(cores.dtype).tiny
    for i in range(l):
        ahead = _gather_ahead(beta[:, i + 1].transpose(1, 2), idx)  # [b, r, Q, C]
        if diagonal:  # W[n, k, a]; each token's weight sum_a G(x)[a] W[class(x)][a]
            w = torch.einsum("naq,naqk->nka", fwd, ahead)
            joint = (cores[:, i] * w.gather(1, automata.token_class[..., None].expand(b, v, r))).sum(-1)
            contribution = torch.einsum("naq,nka->naqk", fwd, summed[:, i])  # into rank a, state delta(q, k)
        else:
            w = torch.einsum("naq,ncqk->nkac", fwd, ahead)
            per_token = w.gather(1, automata.token_class[..., None, None].expand(b, v, r, r))
            joint = (cores[:, i] * per_token).sum((-2, -1))
            contribution = torch.einsum("naq,nkac->ncqk", fwd, summed[:, i])
        out.append(joint / joint.sum(-1, keepdim=True).clamp_min(tiny))
        moved = torch.zeros(b, r, q_n + 1, dtype=cores.dtype, device=cores.device)
        moved.scatter_add_(2, idx.expand(b, r, -1), contribution.reshape(b, r, q_n * c_n))
        fwd = _scaled(moved[..., :q_n])[0]
    return torch.stack(out, 1)


@own_precision
def constrained_sample(start: torch.Tensor, cores: torch.Tensor, automata: Automata, u: torch.Tensor,
                       diagonal: bool = False, summed: torch.Tensor | None = None,
                       known: torch.Tensor | None = None) -> torch.Tensor:
    """One draw of the whole sequence from p(x | x in L) per row, by the product chain's path: the rank state
    a_0 ~ s_a beta_0[a, q_0]; at each position i the class and next rank state (k, c) ~ G_i(k)[a, c]
    beta_{i+1}[c, delta(q, k)] (diagonal: c = a), then the token x ~ G_i(x)[a, c] among the class's tokens;
    q <- delta(q, k). cores [b, l, V, r, r] (diagonal [b, l, V, r]), ``summed`` their class sums (computed when
    None), u [b, 2 l + 1] float64 uniforms (lane 0 the start, lanes 2i + 1 and 2i + 2 position i's class and
    token), ``known`` as ``backward_messages`` takes it. -> [b, l] long; -1 in rows where nothing is accepted
    (Z = 0)."""
    b, l, v, r = cores.shape[:4]
    c_n = automata.num_classes
    summed = class_sums(cores, automata) if summed is None else summed
    automata, live = live_automata(automata, known, l)
    beta, _ = backward_messages(summed, automata, diagonal, known, live)
    rows = torch.arange(b, device=cores.device)
    q = automata.initial.clamp_min(0)  # -1: the row accepts nothing (w0 = 0 below)
    w0 = start.to(cores.dtype) * _at_start(beta, automata)  # [b, r]
    ok = w0.sum(1) > 0
    a = sample_categorical(w0, u=u[:, 0])
    out = torch.empty(b, l, dtype=torch.long, device=cores.device)
    for i in range(l):
        nxt = automata.delta[rows, q]  # [b, C]
        ahead = torch.cat([beta[:, i + 1], beta.new_zeros(b, 1, r)], 1)  # [b, Q + 1, r]
        at = ahead[rows[:, None], torch.where(nxt < 0, ahead.shape[1] - 1, nxt)].transpose(1, 2)  # [b, r, C]
        if diagonal:
            k, c = sample_categorical(summed[rows, i, :, a] * at[rows, a], u=u[:, 2 * i + 1]), a
            weights = cores[rows, i, :, a]  # [b, V]
        else:
            w = summed[rows, i, :, a, :] * at.transpose(1, 2)  # [b, C, r]: G_i(k)[a, c] beta(c, delta(q, k))
            flat = sample_categorical(w.reshape(b, c_n * r), u=u[:, 2 * i + 1])
            k, c = flat // r, flat % r
            weights = cores[rows, i, :, a, c]  # [b, V]
        inside = automata.token_class == k[:, None]
        x = sample_categorical(torch.where(inside, weights, torch.zeros_like(weights)), u=u[:, 2 * i + 2])
        out[:, i] = x
        q, a = nxt[rows, k].clamp_min(0), c
    return torch.where(ok[:, None], out, torch.full_like(out, -1))


def conditioned_cores(cores: torch.Tensor, x_cond: torch.Tensor) -> torch.Tensor:
    """cores [b, l, V, ...] with every token but x_cond's zeroed where x_cond [b, l] is known (>= 0)."""
    v = cores.shape[2]
    keep = torch.nn.functional.one_hot(x_cond.clamp_min(0), v).to(torch.bool) | (x_cond < 0)[..., None]
    return cores * keep.view(keep.shape + (1,) * (cores.dim() - 3)).to(cores.dtype)


class Constrained:
    """p(x | x in L): a joint (``Factorized``, ``CP``, ``TensorTrain``) restricted to the sequences an automaton
    accepts, per row (``Automata``), normalized exactly; a ``JointDistribution`` itself, so the samplers' chain rule
    and joint draws run on it unchanged. Conditioning on x_S multiplies each conditioned position's core by the
    indicator of its token."""

    def __init__(self, joint, automata: Automata, known: torch.Tensor | None = None):
        self.joint = joint
        self.start, self.cores, self.diagonal = joint.chain()  # the messages run in the cores' dtype
        self.automata = automata
        self.known = known  # [b, l]: the tokens whose cores are delta(x = token) I (x_t's), -1 elsewhere
        self.b, self.l, self.v = self.cores.shape[0], self.cores.shape[1], self.cores.shape[2]

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x | x in L) of complete sequences x [b, l]: the chain's value of x over its accepted mass where
        accepted (both as the entries stand: a tempered train's factors cancel), -inf elsewhere."""
        accepted = self.accepts(x)
        summed = class_sums(self.cores, self.automata)
        lp = self.joint.log_prob(x).to(self.cores.dtype) - log_accepted_mass(self.start, summed, self.automata,
                                                                              self.diagonal, self.known)
        return torch.where(accepted, lp, torch.full_like(lp, -torch.inf))

    def accepts(self, x: torch.Tensor) -> torch.Tensor:
        """Whether the automaton of each row accepts its complete sequence x [b, l]. -> [b] bool."""
        rows = torch.arange(self.b, device=x.device)
        q = self.automata.initial
        for i in range(self.l):
            k = self.automata.token_class[rows, x[:, i]]
            q = torch.where(q >= 0, self.automata.delta[rows, q.clamp_min(0), k], q)
        return (q >= 0) & self.automata.accepting[rows, q.clamp_min(0)]

    def log_normalizer(self, x_cond: torch.Tensor | None = None) -> torch.Tensor:
        """log p(x in L, x_S) [b] under the joint (normalized by its total mass: exact at every temperature, each
        row alone): -inf where no accepted sequence agrees with x_cond (None: nothing known)."""
        summed = class_sums(self.cores, self.automata)
        inside = summed if x_cond is None else class_sums(conditioned_cores(self.cores, x_cond), self.automata)
        mass = log_accepted_mass(self.start, inside, self.automata, self.diagonal, self.known)
        return mass - chain_log_total(self.start, summed, self.diagonal)

    def marginals(self, x_cond: torch.Tensor) -> torch.Tensor:
        """p(x^i | x_S, x in L) [b, l, v], one-hot at the conditioned positions."""
        return constrained_marginals(self.start, conditioned_cores(self.cores, x_cond), self.automata, self.diagonal)

    def sample(self, positions: torch.Tensor | None = None, generator=None) -> torch.Tensor:
        """One draw of x_T from p(x_T | x in L), T = ``positions`` [b, l] (all when None), the other positions
        summed out (a whole accepted sequence is drawn, its T kept); uniforms: lanes 0..2l of ``Site.draw``.
        -> [b, l], -1 off T (and in rows where nothing is accepted)."""
        u = uniforms(generator, self.b, 2 * self.l + 1, self.cores.device, Site.draw)
        x = constrained_sample(self.start, self.cores, self.automata, u, self.diagonal, known=self.known)
        return x if positions is None else torch.where(positions, x, torch.full_like(x, -1))
