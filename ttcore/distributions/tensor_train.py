"""Tensor-Train joint (Sec. 4.2, Eq. 9): p(x | x_t) = (1/r) 1^T G_1(x^1) ... G_l(x^l) 1.

cores [b, l, v, r, r], nonnegative, each row j a distribution over (x, k) (Eq. 10). Read as a hidden
Markov chain: the state j starts uniform, and G_i(x, j, k) is the probability of emitting x and moving
to state k. Rank 1 is the standard MDM.
"""

import torch

from ._checks import check_float, check_masked, check_ndim, check_positions, check_simplex, check_tokens
from ._precision import own_precision
from .categorical import sample_categorical
from .streams import Site, uniforms


def _rescale(mats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Divide each [r, r] matrix by its (detached) max so long products stay finite. -> (mats, log c)."""
    c = mats.detach().amax(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(mats.dtype).tiny)
    return mats / c, c.log()[..., 0, 0]


@own_precision
def tt_chain_log_value(mats: torch.Tensor) -> torch.Tensor:
    """log((1/r) 1^T M_1 ... M_l 1) for mats [b, l, r, r] -> [b].

    A balanced tree of pairwise products, O(log l) depth, rescaling every node and carrying the log
    scales, so the value is exact and finite for long, peaked chains (l = 1024 and beyond).
    """
    b, l, r, _ = mats.shape
    mats, log_scale = _rescale(mats)
    log_scale = log_scale.sum(1)  # [b]
    while mats.shape[1] > 1:
        if mats.shape[1] % 2:  # pad the odd one out with the identity
            eye = torch.eye(r, dtype=mats.dtype, device=mats.device).expand(b, 1, r, r)
            mats = torch.cat([mats, eye], 1)
        mats, c = _rescale(mats[:, 0::2] @ mats[:, 1::2])  # [b, l/2, r, r]
        log_scale = log_scale + c.sum(1)
    return (mats[:, 0].sum((-2, -1)) / r).log() + log_scale


def tt_shared_log_prob(cores: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log p(x) of Eq. 9 under one TT shared by every row (cores [l, v, r, r], x [b, l] -> [b]), by the forward
    recursion alpha_i = alpha_{i-1} G_i(x^i) from alpha_0 = 1^T / r, normalized every position and the logs of
    the norms summed: O(b l v r^2) and O(b v r) memory, where ``tt_log_prob`` would gather [b, l, r, r]."""
    l, v, r, _ = cores.shape
    rows = torch.arange(x.shape[0], device=x.device)
    alpha = torch.full((x.shape[0], r), 1.0 / r, dtype=cores.dtype, device=cores.device)
    log_p = torch.zeros(x.shape[0], dtype=cores.dtype, device=cores.device)
    for i in range(l):
        alpha = (alpha @ cores[i].transpose(0, 1).reshape(r, v * r)).view(-1, v, r)[rows, x[:, i]]  # [b, r]
        norm = alpha.sum(1)
        log_p = log_p + norm.log()
        alpha = alpha / norm[:, None]
    return log_p


def tt_select(cores: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """G_i(x^i) for every position: cores [b, l, v, r, r], x [b, l] -> [b, l, r, r]."""
    b, l, v, r, _ = cores.shape
    idx = x.clamp_min(0)[:, :, None, None, None].expand(b, l, 1, r, r)
    return cores.gather(2, idx).squeeze(2)


def tt_log_prob(cores: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log p(x) of Eq. 9 -> [b]."""
    return tt_chain_log_value(tt_select(cores, x))


@own_precision
def _scan(mats: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Inclusive products P_i = M_1 ... M_i (reverse: M_i ... M_l), [b, l, r, r], each known only up to
    a positive factor (every matrix is rescaled by its max). Hillis-Steele: log2(l) batched matmuls."""
    l = mats.shape[1]
    mats = _rescale(mats)[0]
    d = 1
    while d < l:
        prod = mats[:, : l - d] @ mats[:, d:]  # forward: M_{i-d..} @ M_i; reverse: M_i @ M_{i+d..}
        mats = torch.cat([mats[:, :d], prod] if not reverse else [prod, mats[:, l - d:]], 1)
        mats = _rescale(mats)[0]
        d *= 2
    return mats


@own_precision
def tt_state_marginals(contracted: torch.Tensor) -> torch.Tensor:
    """Distribution of the hidden state entering each position, every other position summed out:
    pi_1 = 1/r, pi_i = pi_{i-1} Gbar_{i-1}. With row-stochastic Gbar (Eq. 16 with S empty: the sum
    over x of row-normalized cores) the suffix Gbar_{i+1}..Gbar_l 1 of Eq. 17 is the ones vector, so the
    single-position marginal is p(x^i) = pi_i^T G_i(x^i) 1. contracted [b, l, r, r] -> [b, l, r].

    Inclusive prefix products by the rescaled parallel scan, then each pi_i renormalized to sum 1
    (its true sum), so the scan's scale factors cancel exactly."""
    b, l, r, _ = contracted.shape
    first = contracted.new_full((b, 1, r), 1.0 / r)
    if l == 1:
        return first
    prefix = first.unsqueeze(-2) @ _scan(contracted)[:, :-1]  # [b, l-1, 1, r]: 1^T Gbar_1..Gbar_{i-1}, scaled
    prefix = prefix.squeeze(-2)
    return torch.cat([first, prefix / prefix.sum(-1, keepdim=True)], 1)


def tt_cores_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Row normalization of Eq. 10: softmax over the joint (x, k) axes of each row j.
    logits [..., v, r, r] -> cores of the same shape."""
    *lead, v, r, _ = logits.shape
    if logits.movedim(-3, -1).is_contiguous():  # the head's own layout [..., j, k, x] (``TTHead.core_logits``)
        flat = logits.movedim(-3, -1).reshape(*lead, r, r * v)  # [..., j, (k, x)]: a view
        return torch.softmax(flat, -1).view(*lead, r, r, v).movedim(-1, -3)
    flat = logits.transpose(-3, -2).reshape(*lead, r, v * r)  # [..., j, (x, k)]
    return torch.softmax(flat, -1).reshape(*lead, r, v, r).transpose(-3, -2)


def tt_contracted_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_x G(x) of row-normalized cores (Eq. 10), straight from their logits, without materializing
    the V x r x r cores: exp(logsumexp_x logits[x, j, k] - logsumexp_{x,k} logits[x, j, :]).
    Row-stochastic. logits [..., v, r, r] -> [..., r, r] in the logits' dtype."""
    lse = logits.logsumexp(dim=(-3, -1))  # [..., r]  (over x and k, per row j)
    return (logits.logsumexp(-3) - lse[..., :, None]).exp()


def tt_contract(cores: torch.Tensor, x_cond: torch.Tensor, summed: torch.Tensor | None = None) -> torch.Tensor:
    """Contracted cores of Sec. 4.3 (Eq. 16): G_j(x^j) where conditioned, sum_x G_j(x) otherwise.
    ``summed`` [b, l, r, r] = cores.sum(2) when cached by the caller (it does not depend on x_S)."""
    known = (x_cond >= 0)[:, :, None, None]
    return torch.where(known, tt_select(cores, x_cond), cores.sum(2) if summed is None else summed)


@own_precision
def tt_messages(mats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The train's boundary vectors at every position: left_i = 1^T M_1 .. M_{i-1} and right_i = M_{i+1} .. M_l 1,
    each known up to a positive factor (scaled to max 1). Any nonnegative matrices (row-stochastic or not:
    a tempered train's sums). mats [b, l, r, r] -> (left, right) [b, l, r] each."""
    b, l, r, _ = mats.shape
    ones = mats.new_ones(b, 1, r)
    left = torch.cat([ones, (ones.unsqueeze(-2) @ _scan(mats)[:, :-1]).squeeze(-2)], 1)  # [b, l, r]
    right = torch.cat([(_scan(mats, reverse=True)[:, 1:] @ ones.transpose(1, 2).unsqueeze(1)).squeeze(-1),
                       ones], 1)  # [b, l, r]
    left = left / left.amax(-1, keepdim=True).clamp_min(torch.finfo(left.dtype).tiny)
    right = right / right.amax(-1, keepdim=True).clamp_min(torch.finfo(right.dtype).tiny)
    return left, right


def tt_h_transform(mats: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A train of nonnegative matrices M_i (a tempered train's sums over x: not row-stochastic) as the hidden
    Markov chain with the same path distribution (Doob's h-transform with the right messages h_i =
    ``right``, from ``tt_messages``): M'_i[j, k] = M_i[j, k] h_i(k) / (M_i h_i)(j), row-stochastic, and the
    start state distributed as (M_1 h_1)(j) normalized (the uniform start times what lies ahead).
    mats [b, l, r, r], right [b, l, r] -> (stochastic mats [b, l, r, r], start [b, r])."""
    tiny = torch.finfo(mats.dtype).tiny
    ahead = mats * right[:, :, None, :]
    stochastic = ahead / ahead.sum(-1, keepdim=True).clamp_min(tiny)
    start = ahead[:, 0].sum(-1)
    return stochastic, start / start.sum(-1, keepdim=True).clamp_min(tiny)


@own_precision
def tt_marginals(cores: torch.Tensor, x_cond: torch.Tensor, summed: torch.Tensor | None = None) -> torch.Tensor:
    """p(x^i | x_S) ∝ 1^T Gbar_1..Gbar_{i-1} G_i(x^i) Gbar_{i+1}..Gbar_l 1  (Eq. 17) -> [b, l, v].

    Prefix and suffix products by parallel scans; each position is normalized over v, so p(x_S) is
    never divided by and the per-position scale of the scans cancels.
    """
    b, l, v, r, _ = cores.shape
    left, right = tt_messages(tt_contract(cores, x_cond, summed))
    joint = torch.einsum("blj,blvjk,blk->blv", left, cores, right)  # p(x^i, x_S) up to a factor
    marg = joint / joint.sum(-1, keepdim=True)
    known = (x_cond >= 0).unsqueeze(-1)
    onehot = torch.nn.functional.one_hot(x_cond.clamp_min(0), v).to(cores.dtype)
    return torch.where(known, onehot, marg)


@own_precision
def tt_gap_products(contracted: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Segmented scan: Q_i = product of contracted cores Gbar_j over (last chosen position <= i, i].

    The gap product before a chosen position t is Q_{t-1}: the hidden-state transition across the
    unchosen positions between two chosen ones (Sec. 4.3, special case: absorbing each Gbar_j into a
    neighbour). Products of row-stochastic matrices stay row-stochastic, so no rescaling is needed.
    contracted [b, l, r, r], chosen [b, l] bool -> [b, l, r, r].
    """
    b, l, r, _ = contracted.shape
    eye = torch.eye(r, dtype=contracted.dtype, device=contracted.device)
    mats = torch.where(chosen[:, :, None, None], eye, contracted)
    pos = torch.arange(l, device=chosen.device)
    seg_start = torch.where(chosen, pos, torch.zeros_like(pos)).cummax(1).values  # [b, l]
    d = 1
    while d < l:
        inside = (pos[d:] - d >= seg_start[:, d:])[:, :, None, None]  # [b, l-d, 1, 1]
        tail = torch.where(inside, mats[:, : l - d] @ mats[:, d:], mats[:, d:])
        mats = torch.cat([mats[:, :d], tail], 1)
        d *= 2
    return mats


@own_precision
def tt_prefix_products(contracted: torch.Tensor, upto: torch.Tensor) -> torch.Tensor:
    """P = product of Gbar_j over j < upto, per row, by a balanced tree (log l small batched matmuls).

    The gap product before the first chosen position, when there is only one (every step of a
    generation with K >= l): the same quantity as ``tt_gap_products`` at upto - 1, for a fraction
    of its work. contracted [b, l, r, r], upto [b] -> [b, r, r] (identity where upto = 0).
    """
    b, l, r, _ = contracted.shape
    eye = torch.eye(r, dtype=contracted.dtype, device=contracted.device)
    span = max(int(upto.max()), 1)  # positions from the last needed one on do not enter
    pos = torch.arange(span, device=contracted.device)
    mats = torch.where((pos < upto[:, None])[:, :, None, None], contracted[:, :span], eye)  # [b, span, r, r]
    while mats.shape[1] > 1:
        if mats.shape[1] % 2:
            mats = torch.cat([mats, eye.expand(b, 1, r, r)], 1)
        mats = mats[:, 0::2] @ mats[:, 1::2]  # ordered pairs: the product keeps the chain's order
    return mats[:, 0]


def chosen_index(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen positions in increasing order, padded: chosen [b, l] -> (idx [b, t], valid [b, t])."""
    b, l = chosen.shape
    t = int(chosen.sum(1).max()) if chosen.numel() else 0
    pos = torch.arange(l, device=chosen.device).expand(b, l)
    idx = torch.where(chosen, pos, torch.full_like(pos, l)).sort(1).values[:, :t]  # [b, t]
    valid = idx < l
    return idx.clamp_max(l - 1), valid


def tt_sample_path(contracted: torch.Tensor, chosen: torch.Tensor, core_rows, generator=None,
                   start: torch.Tensor | None = None) -> torch.Tensor:
    """Joint draw of x_T (Sec. 4.3, special case) by ancestral sampling of the hidden chain, exact with
    respect to the train whose unchosen positions are the given ``contracted`` matrices.

    With row-normalized cores the train is a hidden Markov chain: the state j starts uniform, and
    G_i(x, j, k) is the probability of emitting x and moving to state k. Unchosen positions enter
    only through their contracted cores ``contracted`` [b, l, r, r] (sum_x G_j(x); for example from
    the contracted-core head), multiplied over each gap. At each chosen position the state j is drawn
    from the gap's transition, then (x, k) from row j alone: ``core_rows(n, t, j)`` with batch rows n,
    positions t and states j [n] returns G_t(x, j, k) as [n, v, r]. So only r of the r * r core rows
    are ever needed at a chosen position, and nothing is divided. ``generator``: a torch.Generator or the
    batch's ``Streams`` (three uniforms per chosen position of a row, taken at once: ``Site.draw``, lanes
    3a .. 3a + 2 for its a-th chosen position). ``start`` [b, r]: the state's distribution before G_1 (None:
    uniform; a tempered train's h-transform gives its own, ``tt_h_transform``). ``chosen`` [b, l] bool -> [b, l]
    long, -1 off T.
    """
    b, l, r, _ = contracted.shape
    idx, valid = chosen_index(chosen)  # [b, t]
    out = torch.full((b, l), -1, dtype=torch.long, device=chosen.device)
    rows = torch.arange(b, device=chosen.device)
    pos = torch.arange(l, device=chosen.device)
    first = torch.where(chosen, pos, l).amin(1, keepdim=True)
    last = torch.where(chosen, pos, -1).amax(1, keepdim=True)
    between = ~chosen & (pos > first) & (pos < last)  # unchosen positions between chosen ones
    # with none (a block model's step: its chosen positions adjacent), every gap after the first is I
    gaps = tt_gap_products(contracted, chosen) if idx.shape[1] > 1 and between.any() else None  # [b, l, r, r]
    eye = torch.eye(r, dtype=contracted.dtype, device=contracted.device)
    state = contracted.new_full((b, r), 1.0 / r) if start is None else start  # the hidden state before G_1
    u = uniforms(generator, b, 3 * idx.shape[1], chosen.device, Site.draw).view(b, -1, 3)  # [b, t, 3]
    for a in range(idx.shape[1]):
        live = rows[valid[:, a]]  # [n] rows with an a-th chosen position: only they draw
        t = idx[live, a]  # [n]
        if gaps is None and a:  # no unchosen position between this one and the last: the gap is I
            entering = state[live]
        else:
            if gaps is None:  # the first chosen position: its gap is a prefix product
                gap = tt_prefix_products(contracted if len(live) == b else contracted[live], t)  # [n, r, r]
            else:
                gap = torch.where((t > 0)[:, None, None], gaps[live, (t - 1).clamp_min(0)], eye)  # [n, r, r]
            entering = (state[live].unsqueeze(1) @ gap).squeeze(1)
        ua = u[live, a]  # [n, 3]
        j = sample_categorical(entering, u=ua[:, 0])  # the state entering t
        row = core_rows(live, t, j)  # [n, v, r]: G_t(x, j, k)
        x = sample_categorical(row.sum(-1), u=ua[:, 1])  # (x, k) by the chain rule: x, then k | x
        k = sample_categorical(row[torch.arange(len(live), device=row.device), x], u=ua[:, 2])
        out[live, t] = x
        state = state.index_put((live,), torch.nn.functional.one_hot(k, r).to(contracted.dtype))
    return out


class TensorTrain:
    """TT joint with ``cores`` [b, l, v, r, r]; sum over (x, k) of G_i(x, j, k) = 1 for all i, j."""

    def __init__(self, cores: torch.Tensor, validate: bool = True):
        check_float("cores", cores)
        check_ndim("cores", cores, "b, l, v, r, r")
        b, l, v, r, r2 = cores.shape
        if r != r2:
            raise ValueError(f"TT cores must be square in the rank axes [.., r, r], got {r} x {r2}")
        if validate:
            check_simplex("cores", cores, (2, 4), "(x, k) for each row j")
        self.cores = cores
        self.b, self.l, self.v, self.r = b, l, v, r
        self._summed = None

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> "TensorTrain":
        """logits [b, l, v, r, r] -> softmax over the joint (x, k) axes of each row j (Eq. 10)."""
        return cls(tt_cores_from_logits(logits), validate=False)

    @classmethod
    def from_masked(cls, cores_masked: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> "TensorTrain":
        """Full-length TT from head outputs on masked positions: cores_masked [m, v, r, r] for the True
        entries of ``mask`` [b, l]; a known position gets the exact core delta(x = token) * I."""
        check_masked(tokens, mask, cores_masked.shape[0])
        _, v, r, _ = cores_masked.shape
        b, l = tokens.shape
        if bool(mask.all()):  # every position masked (a block model's first step in a block): the head's cores
            return cls(cores_masked.reshape(b, l, v, r, r), validate=False)
        onehot = torch.nn.functional.one_hot(tokens.clamp(0, v - 1), v).to(cores_masked.dtype)  # [b, l, v]
        eye = torch.eye(r, dtype=cores_masked.dtype, device=cores_masked.device)
        cores = onehot[:, :, :, None, None] * eye  # [b, l, v, r, r]
        cores[mask] = cores_masked
        return cls(cores, validate=False)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, l] -> [b], exact in rescaled arithmetic."""
        check_tokens("x", x, self.b, self.l, self.v, allow_free=False)
        return tt_log_prob(self.cores, x)

    def chain(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """s = 1/r (uniform), the dense cores [b, l, v, r, r]."""
        r = self.cores.shape[-1]
        return self.cores.new_full((self.b, r), 1.0 / r), self.cores, False

    def contracted(self) -> torch.Tensor:
        """sum_x G_i(x) [b, l, r, r] (row-stochastic); computed once, reused by every conditioning."""
        if self._summed is None:
            self._summed = self.cores.sum(2)
        return self._summed

    def marginals(self, x_cond: torch.Tensor) -> torch.Tensor:
        """x_cond [b, l] (-1 = free) -> p(x^i | x_S) [b, l, v], one-hot where conditioned."""
        check_tokens("x_cond", x_cond, self.b, self.l, self.v, allow_free=True)
        return tt_marginals(self.cores, x_cond, self.contracted())

    def sample(self, positions: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Exact joint draw at ``positions`` [b, l] (all when None); other positions marginalized, -1."""
        positions = check_positions(positions, self.b, self.l, self.cores.device)
        return tt_sample_path(self.contracted(), positions, lambda n, t, j: self.cores[n, t, :, j, :], generator)
