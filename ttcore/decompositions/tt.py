"""Tensor-Train (Sec. 4.2): r * r outputs per masked position (cores, Eq. 9, laid out e = j * r + k,
each row j normalized over (x, k) by Eq. 10) and the contracted-core head Gbar_j (Sec. 4.3)."""

from dataclasses import dataclass

import torch

from ttcore.distributions import (
    TensorTrain,
    entry_rows,
    is_one,
    softmax64,
    tempered,
    tt_chain_log_value,
    tt_contracted_from_logits,
    tt_cores_from_logits,
    tt_h_transform,
    tt_messages,
    tt_sample_path,
    tt_state_marginals,
)

from .common import output_dtype
from .heads import ComponentHead, zero_linear

CONTRACTIONS = ("head", "exact")  # how masked positions outside a step's set are summed out
EXACT_VALUES = 1 << 24  # full-core values an exact-contraction pass holds at once (float64: 128 MB): its positions
ALL_ROWS_VALUES = 1 << 22  # outputs a draw computes in one head call for all its chosen positions (float64: 32 MB)


def exact_chunk(values: int) -> int:
    """Positions per exact-contraction pass of cores of ``values`` = V x r x r each: as many as ``EXACT_VALUES``
    holds (at least one): 8,456 positions of QM9's TT r = 8 (V = 31), 128 of text's r = 4 (V = 8,192); a fixed 64
    positions made thousands of passes of a few kilobytes each at QM9's size."""
    return max(1, EXACT_VALUES // values)


def tt_selected_log_cores(core_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log G_i(x^i, j, k) under the row normalization of Eq. 10 (softmax over (x, k) for each j),
    without materializing the normalized cores. core_logits [m, v, r, r] -> [m, r, r]."""
    lse = core_logits.logsumexp(dim=(1, 3))  # [m, r]  (over x and k, per row j)
    picked = core_logits[torch.arange(core_logits.shape[0], device=targets.device), targets]  # [m, r, r]
    return picked - lse[:, :, None]


def tt_masked_log_prob(core_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log (1/r) 1^T G_1(x^1) ... G_l(x^l) 1 (Eq. 9), known positions entering as the identity
    (delta(x = token) * I at their own token): ``tt_chosen_log_prob`` with every masked position chosen.
    core_logits [m, v, r, r] -> [b]."""
    r = core_logits.shape[-1]
    none = torch.zeros_like(mask)
    return tt_chosen_log_prob(core_logits, targets, core_logits.new_zeros(0, r, r), mask, none)


def tt_masked_marginal_log_probs(core_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(x^i | x_t) for each masked i (Eqs. 16-17, S = the known positions, which contract to the
    identity): log pi_i^T G_i(x^i) 1 with pi_i the hidden-state marginal (``tt_state_marginals``).
    Needs only the selected and the summed cores, [m, r, r] each. core_logits [m, v, r, r] -> [m]."""
    b, l = mask.shape
    r = core_logits.shape[-1]
    gbar = torch.eye(r, dtype=core_logits.dtype, device=core_logits.device).repeat(b, l, 1, 1)  # [b, l, r, r]
    gbar[mask] = tt_contracted_from_logits(core_logits)
    log_pi = tt_state_marginals(gbar)[mask].clamp_min(torch.finfo(gbar.dtype).tiny).log()  # [m, r]
    return torch.logsumexp(log_pi[:, :, None] + tt_selected_log_cores(core_logits, targets), (1, 2))


def tt_chosen_log_prob(core_logits: torch.Tensor, targets: torch.Tensor, contracted: torch.Tensor,
                       chosen: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """log (1/r) 1^T M_1 ... M_l 1 (Eq. 9) with M_i = G_i(x^i) at the chosen positions (core_logits [m, v, r, r]
    and targets [m], row-major over ``chosen``), the contracted cores ``contracted`` [n, r, r] at the masked
    positions ``rest`` outside them (Sec. 4.3: sum_x G_i(x), or the head's Gbar_i), the identity at known ones.
    -> [b]."""
    b, l = chosen.shape
    r = core_logits.shape[-1]
    mats = torch.eye(r, dtype=core_logits.dtype, device=core_logits.device).repeat(b, l, 1, 1)  # [b, l, r, r]
    mats[chosen] = tt_selected_log_cores(core_logits, targets).exp()
    mats[rest] = contracted.to(mats.dtype)
    return tt_chain_log_value(mats)


def contracted_core_loss(contracted_logits: torch.Tensor, core_logits: torch.Tensor) -> torch.Tensor:
    """L_C = (1/N) sum_j ||Gbar_j - stopgrad(sum_x G_j(x))||_F^2  (Eq. 19), over the masked positions."""
    if contracted_logits.shape[0] == 0:
        return contracted_logits.sum()
    pred = torch.softmax(contracted_logits, -1)  # rows of Gbar_j
    target = tt_contracted_from_logits(core_logits).detach()
    return (pred - target).pow(2).sum((-2, -1)).mean()


def sums_cores_exactly(contraction: str, temperature: float) -> bool:
    """Whether a predetermined TT step sums the cores themselves for the masked positions outside T: asked
    for (``contraction="exact"``), or at a temperature other than 1 (the head predicts the untempered sum)."""
    return contraction == "exact" or not is_one(temperature)


def core_rows64(head, h: torch.Tensor, temperature, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The tempered, row-normalized cores (Eq. 10) of positions with features h [n, d], in float64 and laid
    out by row: [n, j, x, k], one contiguous softmax over (x, k) per row j (a reduction over the middle
    axes of [n, x, j, k] costs about twice as much). ``temperature``: a float or per sequence, with ``rows`` [n]
    the sequence of each position (``tempered``)."""
    logits = head.core_logits(h)  # [n, v, r, r]
    n, v, r, _ = logits.shape
    flat = logits.transpose(1, 2).reshape(n, r, v * r).double()
    return torch.softmax(tempered(flat, temperature, rows), -1).view(n, r, v, r)


def tt_tempered_log_cores(core_logits: torch.Tensor, temperature, rows: torch.Tensor | None = None) -> torch.Tensor:
    """log G_i(x, j, k) / T of the row-normalized cores (Eq. 10, softmax over (x, k) per row j), float64, each
    position shifted by its own maximum (a positive factor per position, which no draw or marginal of the
    tempered train depends on; it keeps the entries of the best path near 1 at small T): the entries of the
    tempered train (docs: concepts, temperature). core_logits [n, v, r, r] -> [n, v, r, r]; ``rows``: as
    ``tempered``."""
    logits = core_logits.double()
    log_h = tempered(logits - logits.logsumexp((1, 3), keepdim=True), temperature, rows)
    return log_h - log_h.amax((1, 2, 3), keepdim=True)


def tempered_log_cores(head, h: torch.Tensor, temperature, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``tt_tempered_log_cores`` of positions with features h [n, d], laid out by row: [n, j, x, k]."""
    return tt_tempered_log_cores(head.core_logits(h), temperature, rows).transpose(1, 2)


def exact_contracted_cores(head, h: torch.Tensor, temperature, rows: torch.Tensor | None = None) -> torch.Tensor:
    """sum_x G_j(x) (Eq. 16 with j outside S) from the head's V x r x r outputs, in float64, chunked over
    positions; at T != 1 the tempered train's sum_x G_j(x)^(1/T) (``tempered_log_cores``: up to a factor per
    position), no longer row-stochastic. h [n, d] -> [n, r, r]."""
    n = exact_chunk(head.e * head.out_vocab)
    if is_one(temperature):
        return torch.cat([core_rows64(head, h[s:s + n], 1.0).sum(2) for s in range(0, len(h), n)])
    return torch.cat([tempered_log_cores(head, h[s:s + n], temperature, None if rows is None else rows[s:s + n]
                                         ).exp().sum(2) for s in range(0, len(h), n)])


def tempered_sums(head, h: torch.Tensor, masked: torch.Tensor, temperature) -> torch.Tensor:
    """The tempered train's matrices at every position: sum_x G_i(x)^(1/T) at the masked ones, the identity at
    the known ones. -> [b, l, r, r] float64."""
    b, l = masked.shape
    mats = torch.eye(head.rank, dtype=torch.float64, device=h.device).repeat(b, l, 1, 1)
    if masked.any():
        mats[masked] = exact_contracted_cores(head, h[masked], temperature, entry_rows(temperature, masked))
    return mats


def tt_tempered_marginals(head, h: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor,
                          temperature) -> torch.Tensor:
    """p_T(x^i) at the chosen positions of the tempered train (docs: concepts, temperature): every other masked
    position summed, left_i^T G_i(x)^(1/T) right_i normalized over x (Eq. 17 with the tempered train's
    matrices, ``tt_messages``). -> [m, v] float64, row-major over chosen."""
    left, right = tt_messages(tempered_sums(head, h, masked, temperature))
    left, right, hc, rc = left[chosen], right[chosen], h[chosen], entry_rows(temperature, chosen)
    marg = None
    n = exact_chunk(head.e * head.out_vocab)
    for s in range(0, len(hc), n):
        cores = tempered_log_cores(head, hc[s:s + n], temperature,
                                   None if rc is None else rc[s:s + n]).exp()  # [n, j, x, k]
        part = torch.einsum("nj,njxk,nk->nx", left[s:s + n], cores, right[s:s + n])
        marg = part.new_empty(len(hc), part.shape[1]) if marg is None else marg
        marg[s:s + n] = part / part.sum(-1, keepdim=True)
    return marg


def tt_chosen_marginals(head, h: torch.Tensor, masked: torch.Tensor, chosen: torch.Tensor, temperature: float,
                        contraction: str = "exact") -> torch.Tensor:
    """p(x^i | x_t) at the chosen positions [b, l] only (Eqs. 16-17, S = the known positions): pi_i^T G_i(x) 1
    with pi_i the hidden-state marginal (``tt_state_marginals``), in float64. The marginals of the joint a
    predetermined step draws from (``TTDecomposition.draw``): the other masked positions
    enter through the contracted-core head (``contraction="head"``, temperature 1) or the cores' own sums
    (``"exact"``: the TT of Eq. 9, as ``TensorTrain.marginals``); the chosen ones through their own sums.
    Full V x r x r cores are computed for a chunk of positions at a time. At T != 1: the tempered train's
    (``tt_tempered_marginals``). -> [m, v], row-major over chosen."""
    if not is_one(temperature):
        return tt_tempered_marginals(head, h, masked, chosen, temperature)
    b, l = masked.shape
    r = head.rank
    pos = torch.arange(l, device=masked.device)
    last = torch.where(chosen, pos, -1).amax(1)  # [b]: no pi_i needs the sums from here on
    before = masked & (pos < last[:, None])
    summed = before & chosen if not sums_cores_exactly(contraction, temperature) else before
    by_head = before & ~summed
    contracted = torch.eye(r, dtype=torch.float64, device=masked.device).repeat(b, l, 1, 1)  # known: I
    if summed.any():
        contracted[summed] = exact_contracted_cores(head, h[summed], temperature, entry_rows(temperature, summed))
    if by_head.any():
        contracted[by_head] = head.contracted_cores(h[by_head]).to(contracted.dtype)
    pi = tt_state_marginals(contracted)[chosen]  # [m, r]
    hc, rc, marg = h[chosen], entry_rows(temperature, chosen), None  # marg: filled chunk by chunk, one [m, v] alive
    n = exact_chunk(head.e * head.out_vocab)
    for s in range(0, len(pi), n):
        cores = core_rows64(head, hc[s:s + n], temperature, None if rc is None else rc[s:s + n])  # [n, j, x, k]
        marg = pi.new_empty(len(pi), cores.shape[2]) if marg is None else marg
        marg[s:s + n] = torch.einsum("nj,njxk->nx", pi[s:s + n], cores)
    return marg


@dataclass
class TTOutputs:
    """``core_logits`` [m, v, r, r] ([x, j, k]) per masked position; ``contracted_logits`` [m, r, r] from
    the contracted-core head (softmax over k gives Gbar_j), None for a model without one."""
    mask: torch.Tensor
    core_logits: torch.Tensor
    contracted_logits: torch.Tensor | None = None

    def joint(self, tokens: torch.Tensor, temperature: float = 1.0) -> TensorTrain:
        """float32 (a text sample's r=4 cores are 67 MB; each draw renormalizes in float64); at T != 1 the
        tempered train's entries G(x)^(1/T), in float64 (docs: concepts, temperature): not row-stochastic,
        which the train's marginals do not need."""
        if is_one(temperature):
            return TensorTrain.from_masked(tt_cores_from_logits(self.core_logits), tokens, self.mask)
        cores = tt_tempered_log_cores(self.core_logits, temperature, entry_rows(temperature, self.mask)).exp()
        return TensorTrain.from_masked(cores, tokens, self.mask)

    def log_prob(self, x0: torch.Tensor) -> torch.Tensor:
        return tt_masked_log_prob(self.core_logits, x0[self.mask], self.mask)

    def marginal_log_probs(self, x0: torch.Tensor) -> torch.Tensor:
        return tt_masked_marginal_log_probs(self.core_logits, x0[self.mask], self.mask)

    def auxiliary_loss(self) -> torch.Tensor:
        if self.contracted_logits is None:
            return self.core_logits.new_zeros(())
        return contracted_core_loss(self.contracted_logits, self.core_logits)


class TTHead(ComponentHead):
    """r * r core outputs per masked position (``ComponentHead``, e = j * r + k) and the contracted-core head
    Gbar_j(x_t) (``contracted``, Sec. 4.3 special case, zero-initialized: uniform rows)."""

    aux = ("contracted",)

    def __init__(self, rank, kind, hidden_dim, out_vocab, base):
        super().__init__(rank * rank, rank, kind, hidden_dim, out_vocab, base)
        self.contracted = zero_linear(hidden_dim, rank * rank)

    def grown_sources(self, rank: int) -> torch.Tensor:
        """Output (J, K) = J * R + K copies (J // m, K // m) of the rank-r head, m = R / r: the cores kron(G, J / m)
        up to the row normalization of Eq. 10, and the contracted head's rows likewise."""
        m = self.rank // rank
        state = torch.arange(self.rank) // m
        return (state[:, None] * rank + state[None, :]).flatten()

    def core_logits(self, h: torch.Tensor) -> torch.Tensor:
        """All V x r x r core logits of positions with features h [n, d] -> [n, v, r, r] float32 (Eq. 10
        normalizes them per row j; float64 for a float64 model)."""
        r = self.rank
        comp = output_dtype(self.component_logits(h))  # [n, r*r, v]
        return comp.view(-1, r, r, comp.shape[-1]).permute(0, 3, 1, 2)

    def contracted_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The contracted-core head's logits: h [n, d] -> [n, r, r] float32 (softmax over k: Gbar_j)."""
        return output_dtype(self.contracted(h)).view(-1, self.rank, self.rank)

    def contracted_cores(self, h: torch.Tensor) -> torch.Tensor:
        """Gbar_j = sum_x G_j(x) predicted directly, row-stochastic. h [n, d] -> [n, r, r] float32."""
        return torch.softmax(self.contracted_logits(h), -1)


class TTDecomposition:
    name, joint_head, joint_dtype = "tt", True, torch.float32
    chains = True
    contractions = CONTRACTIONS

    def sums_exactly(self, contraction: str, temperature: float, joint: bool, adaptive: bool) -> bool:
        """The exact contraction or a temperature (``sums_cores_exactly``), and the rank-1 view of a
        predetermined step, whose marginals are exact (``tt_chosen_marginals``)."""
        return sums_cores_exactly(contraction, temperature) or not (joint or adaptive)

    def summing_values(self, rank: int, out_vocab: int) -> int:
        """One chunk of full cores (``exact_chunk``): ``EXACT_VALUES``, or one position's if more."""
        return exact_chunk(out_vocab * rank * rank) * out_vocab * rank * rank

    def outputs_per_position(self, rank: int) -> int:
        return rank * rank

    def build_head(self, rank, kind, hidden_dim, out_vocab, base) -> TTHead:
        return TTHead(rank, kind, hidden_dim, out_vocab, base)

    def outputs(self, head, h: torch.Tensor, mask: torch.Tensor) -> TTOutputs:
        hm = h[mask]  # [m, d]
        return TTOutputs(mask, head.core_logits(hm), head.contracted_logits(hm))

    def draw(self, head, h, x, masked, chosen, temperature, generator, contraction) -> torch.Tensor:
        """Ancestral sampling of the hidden chain (``tt_sample_path``): the masked positions outside T
        enter through contracted cores, from the contracted-core head (``contraction="head"``, exact with
        respect to the joint whose off-T factors are the head's Gbar_j) or summed from the cores
        themselves (``"exact"``: exact with respect to the TT of Eq. 9); at a temperature other than 1
        the head is not used (it predicts the untempered sum). At a chosen position only the core row
        of the sampled state is read: a large head computes its r outputs of the r * r there; a small one
        (``gathers_all``) computes all of them anyway, so once for every chosen position, before the path."""
        if contraction not in CONTRACTIONS:
            raise ValueError(f"contraction must be one of {CONTRACTIONS}, got {contraction!r}")
        if not is_one(temperature):
            return self._draw_tempered(head, h, masked, chosen, temperature, generator)
        b, l = x.shape
        r = head.rank
        contracted = torch.eye(r, dtype=torch.float64, device=x.device).repeat(b, l, 1, 1)  # known: I
        pos = torch.arange(l, device=x.device)
        last = torch.where(chosen, pos, -1).amax(1)  # [b] last chosen position: the rows after it sum to 1
        rest = masked & ~chosen & (pos < last[:, None])
        if rest.any():
            if sums_cores_exactly(contraction, temperature):  # the cores' own sum
                contracted[rest] = exact_contracted_cores(head, h[rest], temperature, entry_rows(temperature, rest))
            else:  # Gbar_j from the contracted-core head
                contracted[rest] = head.contracted_cores(h[rest]).to(contracted.dtype)

        m = int(chosen.sum())
        if head.gathers_all(h) and m * head.e * head.out_vocab <= ALL_ROWS_VALUES:
            # the head computes every output of a position anyway: all chosen positions' in one call, read at the
            # sampled states (one head call, not one a position)
            slot = torch.full_like(x, -1)
            slot[chosen] = torch.arange(m, device=x.device)
            every = head.component_logits(h[chosen]).reshape(m, r, r * head.out_vocab)  # [m, j, (k, x)]

            def row_logits(n, t, j):
                return every[slot[n, t], j]
        else:
            def row_logits(n, t, j):  # the r outputs of row j only: [n, (k, x)]
                return head.select_logits(h[n, t], j * r, r).reshape(len(n), -1)

        def core_rows(n, t, j):  # G_t(x, j, k) for the sampled state j of rows n, row j normalized (Eq. 10): [n, v, r]
            return softmax64(row_logits(n, t, j), temperature, rows=n).view(len(n), r, -1).transpose(1, 2)

        return tt_sample_path(contracted, chosen, core_rows, generator)

    @staticmethod
    def _draw_tempered(head, h, masked, chosen, temperature, generator) -> torch.Tensor:
        """The draw at T != 1, exact with respect to the tempered train (docs: concepts, temperature): every
        masked position's sum_x G(x)^(1/T) from its full cores, the right messages through them, and the
        train drawn as the hidden Markov chain of its h-transform (``tt_h_transform``: the start state and
        each transition weighed by what lies ahead). At a chosen position row j of its cores is computed
        again, times the message after it."""
        r, tiny = head.rank, torch.finfo(torch.float64).tiny
        mats = tempered_sums(head, h, masked, temperature)
        _, right = tt_messages(mats)
        stochastic, start = tt_h_transform(mats, right)

        def core_rows(n, t, j):  # G_t(x, j, k)^(1/T) right_t(k), normalized over (x, k): [n, v, r]
            logits = head.select_logits(h[n, t], j * r, r).reshape(len(n), -1).double()  # [n, k * v]
            log_h = tempered(logits - logits.logsumexp(-1, keepdim=True), temperature, n)
            ahead = log_h.view(len(n), r, -1) + right[n, t].clamp_min(tiny).log()[:, :, None]  # [n, k, v]
            return torch.softmax(ahead.reshape(len(n), -1), -1).view(len(n), r, -1).transpose(1, 2)

        return tt_sample_path(stochastic, chosen, core_rows, generator, start=start)

    def chosen_log_prob(self, head, h, masked, chosen, x) -> torch.Tensor:
        """``tt_chosen_log_prob`` with the contracted-core head's Gbar_j at the masked positions outside T before
        the last chosen one (after it every row sums to 1), as ``draw`` contracts them."""
        pos = torch.arange(x.shape[1], device=x.device)
        last = torch.where(chosen, pos, -1).amax(1)
        rest = masked & ~chosen & (pos < last[:, None])
        return tt_chosen_log_prob(head.core_logits(h[chosen]), x[chosen], head.contracted_cores(h[rest]), chosen,
                                  rest)

    def component_weights(self, head, h, masked, temperature) -> torch.Tensor:
        """w_{i,(j,k)} = pi_{i,j} Gbar_{i,jk}, output e = j * r + k: p(x^i) = pi_i^T G_i(x^i) 1 (Eqs. 16-17) and
        row j of G_i(x) splits as sum_k Gbar_{jk} softmax_x(output (j, k)), since Gbar_{jk} = sum_x G_i(x)_{jk}
        (Eq. 10's row normalization). pi_i and Gbar come from the contracted-core head (``tt_state_marginals``;
        known positions contract to the identity), so no V x r x r core is computed; the head predicts the
        untempered sums, so at another temperature the weights are those of temperature 1."""
        b, l = masked.shape
        r = head.rank
        contracted = torch.eye(r, dtype=torch.float64, device=h.device).repeat(b, l, 1, 1)  # known: I
        gbar = head.contracted_cores(h[masked]).to(contracted.dtype)  # [m, r, r]
        contracted[masked] = gbar
        pi = tt_state_marginals(contracted)[masked]  # [m, r]
        return (pi[:, :, None] * gbar).reshape(len(pi), r * r)

    def marginals_at(self, head, h, masked, chosen, temperature, contraction) -> torch.Tensor:
        if contraction not in CONTRACTIONS:
            raise ValueError(f"contraction must be one of {CONTRACTIONS}, got {contraction!r}")
        return tt_chosen_marginals(head, h, masked, chosen, temperature, contraction)
