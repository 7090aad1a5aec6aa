"""The generation loop: K denoising steps, one backbone call each, a state yielded after every step.

``GenerationRun`` holds one request's state; ``batch_step`` advances any number of runs by one step with ONE
backbone call and, per group of runs with the same sampler settings, one choice and one joint draw for all
their sequences. A run stepped alone (``GenerationRun.step``, ``generate``) is a batch of one: the same code.
Every random number comes from counter-based streams keyed by the run's seed, the sequence's index in the
run and the step (``ttcore.distributions.streams``), so a run's tokens are the same alone and in any batch.
"""

import bisect
import time
from dataclasses import dataclass
from functools import partial

import torch

from ttcore.distributions import Streams
from ttcore.errors import InvalidSampler
from ttcore.models.vadd import prior_sample

from .config import SamplerConfig
from .constrained import batch_automaton, check_constraint
from .steps.base import Rows

SEED_LIMIT = 2**63  # seeds are nonnegative int64: the streams' key is the seed's two 32-bit halves


@dataclass
class StepState:
    tokens: torch.Tensor  # [b, l], [MASK] id where still masked (shared with the run: do not modify in place)
    committed: torch.Tensor  # [b, l] bool: positions unmasked by this step
    step: int  # steps taken so far (1-based after the first)
    model_calls: int  # backbone calls so far
    done: bool  # True on the final state: tokens hold the finished sequences


class GenerationRun:
    """One generation request: its sampler, its random streams and its partially unmasked sequences.

    - ``seed``: the key of the run's counter-based streams (0 <= seed < 2^63; None: a random one);
    - ``prompt`` [l] or [b, l]: known tokens, [MASK] elsewhere;
    - ``max_rows_per_pass``: micro-batches that bound a step's memory (the choice and the draw, not the backbone);
    - ``constraint`` (``TokenDFA``): each step draws from the joint restricted to its language, so every finished
      sequence is accepted (``ConstraintError`` when no accepted sequence agrees with the prompt);
    - ``kv_cache``: a kind that holds a cache computes only the positions it draws, from the earlier ones' keys
      and values (``ModelKind.cached_features``; the same tokens up to float rounding);
    - ``stop_token`` (a kind that ``stops``, unconstrained): a sequence is finished at the block that completes
      holding it, every later position set to it (text's end-of-text)."""

    def __init__(self, model, num_samples: int, steps: int, config: SamplerConfig | None = None, *,
                 seed: int | None = None, prompt: torch.Tensor | None = None,
                 device: str | torch.device | None = None, max_rows_per_pass: int | None = None,
                 constraint=None, kv_cache: bool = True, stop_token: int | None = None):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if max_rows_per_pass is not None and max_rows_per_pass < 1:
            raise ValueError(f"max_rows_per_pass must be >= 1, got {max_rows_per_pass}")
        if seed is not None and not 0 <= seed < SEED_LIMIT:
            raise ValueError(f"seed must lie in [0, 2^63), got {seed}")
        self.config = config = config or SamplerConfig()
        self.sampler = config.step  # the step's whole rule: counts, choice, draw (``ttcore.sampling.steps``)
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.steps = steps
        self.max_rows_per_pass = max_rows_per_pass
        self.mask_id = model.cfg.dit.mask_id
        length = model.cfg.dit.length
        self.seed = seed if seed is not None else int(torch.randint(0, SEED_LIMIT - 1, (1,)))
        self.streams = Streams.of_request(self.seed, num_samples, device=self.device)
        # a latent model: z ~ p(z) per sequence from its own stream, once (VADD) or at every step (Di4C: ``latent``)
        latent_dim = getattr(model.cfg.dit, "latent_dim", 0)
        self.latent = prior_sample(num_samples, latent_dim, self.streams, self.device) if latent_dim else None
        self.latent_per_step = bool(latent_dim) and getattr(model.cfg, "latent_draw", "run") == "step"
        if prompt is None:
            self.tokens = torch.full((num_samples, length), self.mask_id, dtype=torch.long, device=self.device)
        else:
            prompt = prompt.to(self.device, torch.long)
            if prompt.shape[-1] != length or prompt.dim() not in (1, 2):
                raise ValueError(f"prompt must have shape [{length}] or [b, {length}], got {tuple(prompt.shape)}")
            if int(prompt.min()) < 0 or int(prompt.max()) > self.mask_id:
                raise ValueError(f"prompt ids must lie in [0, {self.mask_id}]")
            self.tokens = prompt.expand(num_samples, length).clone() if prompt.dim() == 1 else prompt.clone()
        kind = model.cfg.kind  # what it can generate (``ttcore.kinds``): refused here, naming the setting
        kind.check_run(config, steps, self.tokens, self.mask_id, constraint is not None)
        self.constraint = constraint
        self.kv_cache = kv_cache and kind.holds_cache
        self.kv = None  # the run's ``KVCache`` between steps (dropping it costs a prefill, nothing else)
        if stop_token is not None and not (kind.stops and constraint is None and 0 <= stop_token < self.mask_id):
            raise InvalidSampler("stop_token", f"stop_token ends a sequence at the block holding it: it takes a "
                                               f"token id in [0, {self.mask_id}), a kind that generates block by "
                                               f"block and no constraint (the constraint decides the tail), got "
                                               f"{stop_token} on {kind.description}")
        self.stop_token = stop_token
        if constraint is not None:
            check_constraint(constraint, self.sampler, model, self.tokens, self.mask_id)
        self.n_initial = (self.tokens == self.mask_id).sum(1)
        self._active: list[int] | None = None  # ``skip_idle_steps``: the steps that unmask something (once)
        self.masked_left = int(self.n_initial.sum())  # kept on the host: ``done`` never waits on the device
        self.plan = self.sampler.plan(self)  # what the step keeps for the run (a predetermined order's priorities)
        self.step_index, self.model_calls = 0, 0

    def step_latent(self) -> torch.Tensor | None:
        """The sequences' latent z for the coming step: VADD's, drawn once per run (``ModelConfig.latent_draw``
        ``run``); a Di4C student's, drawn again at every step from that step's streams (``step``), so each step
        draws from its mixture E_z prod_i p(x^i | x_t, z). None: no latent."""
        if not self.latent_per_step:
            return self.latent
        streams = Streams(self.streams.seed, self.streams.row, torch.full_like(self.streams.step, self.step_index))
        return prior_sample(self.tokens.shape[0], self.latent.shape[1], streams, self.device)

    @property
    def done(self) -> bool:
        return self.step_index >= self.steps or self.masked_left == 0

    def step(self) -> StepState:
        """Advance one denoising step (a batch of one: ``batch_step``)."""
        return batch_step(self.model, [self]).states[0]

    def skip_idle_steps(self) -> int:
        """Advance past the coming steps that unmask no token in any sequence, as the step's schedule says
        before they run (``Step.active_steps``, computed once a run; more steps than positions leaves most
        empty): such a step would change nothing, and every draw is keyed by its own step, so the run's tokens
        are the same with or without them. -> steps skipped. The service calls it before each step (an idle step
        cost it an engine iteration: 0.7 ms each, 0.7 s for 1,024 steps of QM9's 22 positions)."""
        if self._active is None:
            active = self.sampler.active_steps(self)
            self._active = list(range(self.steps)) if active is None else active
        if self.done:
            return 0
        upcoming = self._active[bisect.bisect_left(self._active, self.step_index)]
        skipped, self.step_index = upcoming - self.step_index, upcoming
        return skipped


@dataclass
class BatchStep:
    """What ``batch_step`` did: each run's new state, and its one backbone call as measured."""
    states: list[StepState]  # one per run, in order
    tokens: torch.Tensor  # [B, l]: every run's tokens after the step, the runs' rows in order (one tensor to copy)
    committed: torch.Tensor  # [B, l] bool: the positions each row committed in this step
    in_forward: list[bool]  # per run: whether its sequences went through the backbone call
    forward_rows: int  # sequences in the backbone call (0: no run needed the model)
    forward_seconds: float  # wall time of the backbone call (on CUDA, to the end of its kernels)
    seconds: float  # wall time of the whole step (on CUDA, to the end of the forward's kernels only)
    group_seconds: list[float]  # per run: its share (by rows) of its own group's choose and draw time


def _take(t: torch.Tensor | None, index: torch.Tensor | None):
    """Rows ``index`` of t (None: all of them, no op)."""
    return t if t is None or index is None else t[index]


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class _Batch:
    """The rows of a batched step: every run's tokens in one tensor, each run's row span, and the batch rows of
    any subset of runs."""

    def __init__(self, runs: list[GenerationRun]):
        self.runs, self.sizes = runs, [run.tokens.shape[0] for run in runs]
        self.starts = [0]
        for n in self.sizes:
            self.starts.append(self.starts[-1] + n)
        self.tokens = _cat([run.tokens for run in runs])  # [B, l]
        self.device = self.tokens.device
        self.masked = self.tokens == runs[0].mask_id

    def rows_of(self, members: list[int]) -> torch.Tensor | None:
        """Batch rows of these runs (None: every row)."""
        if len(members) == len(self.runs):
            return None
        return torch.tensor([r for i in members for r in range(self.starts[i], self.starts[i + 1])],
                            device=self.device)


def _groups(model, batch: _Batch) -> tuple[list, torch.Tensor]:
    """Runs of equal sampler settings share one ``counts``, ``choose`` and ``draw`` (the exact chain rule steps
    each run apart: see ``batch_step``). -> ([(config, members, index, rows)], counts [B])."""
    runs, sizes, device = batch.runs, batch.sizes, batch.device
    n_current, length = batch.masked.sum(1), batch.tokens.shape[1]
    seed, row, step, steps = torch.tensor([(run.seed, r, run.step_index, run.steps) for run in runs
                                           for r in range(run.tokens.shape[0])], device=device).unbind(1)
    streams = Streams(seed, row, step)
    n_initial = _cat([run.n_initial for run in runs])
    groups: dict[tuple, list[int]] = {}  # equal settings (the temperature per sequence) -> their runs
    for i, run in enumerate(runs):
        groups.setdefault((run.config.batch_key, i if run.sampler.adaptive else -1, run.constraint is not None),
                          []).append(i)
    counts, parts = None, []
    for members in groups.values():
        index, config = batch.rows_of(members), runs[members[0]].config
        plan = None if runs[members[0]].plan is None else _cat([runs[i].plan for i in members])
        temperature = config.temperature
        if temperature != 1.0 and any(runs[i].config.temperature != temperature for i in members):
            temperature = torch.tensor([runs[i].config.temperature for i in members for _ in range(sizes[i])],
                                       dtype=torch.float64, device=device)
        automaton = None if runs[members[0]].constraint is None else \
            batch_automaton([runs[i].constraint for i in members], [sizes[i] for i in members], device)
        stop = None
        if any(runs[i].stop_token is not None for i in members):
            stop = torch.tensor([-1 if runs[i].stop_token is None else runs[i].stop_token for i in members
                                 for _ in range(sizes[i])], device=device)
        rows = Rows(model, config, streams.rows(index) if index is not None else streams, _take(n_initial, index),
                    _take(step, index), _take(steps, index), plan, length, temperature, automaton, stop)
        c = config.step.counts(rows, _take(n_current, index))
        parts.append((config, members, index, rows))
        if index is None:
            counts = c
        else:
            counts = torch.empty_like(n_current) if counts is None else counts
            counts[index] = c
    return parts, counts


def _draw_groups(batch: _Batch, parts: list, counts: torch.Tensor, need: list[bool], h: torch.Tensor,
                 fwd: list[int]) -> tuple[torch.Tensor | None, list[float]]:
    """Each group's ``choose`` and ``draw`` on its rows of the features ``h`` (the rows of runs ``fwd``), in
    micro-batches of at most the group's smallest ``max_rows_per_pass``. -> (values [B, l] or None, each
    run's share of the wall time of its own group's work: by rows within the group, so that a cheap group's
    runs are not charged for an expensive one's)."""
    runs, sizes, tokens, masked, device = batch.runs, batch.sizes, batch.tokens, batch.masked, batch.device
    at_h, offset = {}, 0  # batch row start of each forward run -> its row start in h
    for i in fwd:
        at_h[i], offset = offset, offset + sizes[i]
    values, spent = None, [0.0] * len(runs)
    timed = tokens.is_cuda and len(parts) > 1  # on CUDA a group's time is its kernels': synchronize between
    for config, members, index, rows in parts:
        go = [i for i in members if need[i]]
        if not go:
            continue
        t0 = time.perf_counter()
        if len(go) == len(runs):  # everything, in one group: no gathers
            b_index, h_index, grows = None, None, rows
        else:
            b_index = batch.rows_of(go)
            h_index = torch.tensor([at_h[i] + r for i in go for r in range(sizes[i])], device=device)
            grows = rows if go == members else _rows_among(rows, members, go, sizes)
        hg, tg, mg, cg = _take(h, h_index), _take(tokens, b_index), _take(masked, b_index), _take(counts, b_index)
        cap = min((runs[i].max_rows_per_pass or len(tg)) for i in go)
        out = []
        for s0 in range(0, len(tg), cap):  # micro-batches bound the choice's and the draw's memory
            part = slice(s0, s0 + cap) if cap < len(tg) else slice(None)
            pr = grows if cap >= len(tg) else grows[part]
            chosen = config.step.choose(pr, hg[part], tg[part], mg[part], cg[part])
            out.append(config.step.draw(pr, hg[part], tg[part], mg[part], chosen, cg[part]))
        v = _cat(out)
        if b_index is None:
            values = v
        else:
            values = torch.full_like(tokens, -1) if values is None else values
            values[b_index] = v
        if timed:
            torch.cuda.synchronize(device)
        took, group_rows = time.perf_counter() - t0, sum(sizes[i] for i in go)
        for i in go:
            spent[i] = took * sizes[i] / group_rows
    return values, spent


@torch.inference_mode()
def batch_step(model, runs: list[GenerationRun], forward=None) -> BatchStep:
    """One denoising step of several runs of ``model``: one backbone call over every sequence whose step unmasks
    anything, then per group of runs with equal settings one ``counts``, ``choose`` and ``draw`` (micro-batched at
    the group's smallest ``max_rows_per_pass``).

    A sequence's tokens depend only on its features and its streams, so a run gets what it would get alone, up to
    float rounding of batch-size-dependent kernels; exact chain-rule runs (``Step.adaptive``) step apart, since
    their picks compare float32 marginals. ``forward``: the backbone call (``graphs.ForwardGraphs``; None:
    ``model.features``); runs with a ``kv_cache`` take their kind's ``cached_features``. Run it under
    ``model.compute_context()``."""
    t0 = time.perf_counter()
    batch = _Batch(runs)
    parts, counts = _groups(model, batch)
    row_needed = (counts != 0).tolist()  # one wait for the whole batch
    need = [any(row_needed[batch.starts[i]:batch.starts[i + 1]]) for i in range(len(runs))]
    fwd = [i for i in range(len(runs)) if need[i]]
    forward_s, forward_rows, values, spent = 0.0, 0, None, [0.0] * len(runs)
    if fwd:
        x = _take(batch.tokens, batch.rows_of(fwd))
        latent = _cat([runs[i].step_latent() for i in fwd]) if runs[0].latent is not None else None
        if x.is_cuda:  # the forward's own time: what was queued before it finishes first
            torch.cuda.synchronize(x.device)
        t1 = time.perf_counter()
        if all(runs[i].kv_cache for i in fwd):  # a cached kind's steps (autoregressive, blocks): from the caches
            h, caches = model.cfg.kind.cached_features(model, [runs[i] for i in fwd], [batch.sizes[i] for i in fwd],
                                                       x)
            for i, cache in zip(fwd, caches):
                runs[i].kv = cache
        elif (ends := [runs[i].sampler.prefix_needed(runs[i]) for i in fwd]) and None not in ends:
            h = _prefix_features(model, x, latent, max(ends))  # only the positions the steps read: a prefix
        else:
            h = (forward or partial(features, model))(x, latent)  # [rows of fwd, l, d]
        h = h if h.dtype == torch.float64 else h.float()  # bf16 features to float32; a float64 model's stay
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        forward_s, forward_rows = time.perf_counter() - t1, x.shape[0]
        values, spent = _draw_groups(batch, parts, counts, need, h, fwd)
    values = torch.full_like(batch.tokens, -1) if values is None else values
    committed = values >= 0
    new = torch.where(committed, values, batch.tokens)
    left = (new == runs[0].mask_id).sum(1).tolist()  # the second and last wait
    states = []
    for i, run in enumerate(runs):
        a, b = batch.starts[i], batch.starts[i + 1]
        run.tokens = new if len(runs) == 1 else new[a:b]
        run.masked_left = sum(left[a:b])
        run.step_index += 1
        run.model_calls += int(need[i])
        if run.done:
            run.kv = None
        states.append(StepState(run.tokens, committed if len(runs) == 1 else committed[a:b], run.step_index,
                                run.model_calls, run.done))
    return BatchStep(states, new, committed, need, forward_rows, forward_s, time.perf_counter() - t0, spent)


def _rows_among(rows: Rows, members: list[int], go: list[int], sizes: list[int]) -> Rows:
    """The ``Rows`` of the runs ``go`` (a subset of ``members``, in order) out of the group's ``rows``."""
    at, keep = 0, []
    for i in members:
        if i in go:
            keep.extend(range(at, at + sizes[i]))
        at += sizes[i]
    return rows[torch.tensor(keep, device=rows.n_initial.device)]


def _prefix_features(model, x: torch.Tensor, latent: torch.Tensor | None, end: int) -> torch.Tensor:
    """The features of x [b, l]'s first ``end`` positions (a model whose position i reads none after the block of
    i: ``Step.prefix_needed``), zero after them -> [b, l, d]."""
    h = features(model, x[:, :end], latent)
    if end == x.shape[1]:
        return h
    return torch.cat([h, h.new_zeros(h.shape[0], x.shape[1] - end, h.shape[2])], 1)


def features(model, tokens: torch.Tensor, latent: torch.Tensor | None) -> torch.Tensor:
    """The backbone call of a step: ``model.features(tokens)``, with the sequences' VADD latents if any."""
    return model.features(tokens) if latent is None else model.features(tokens, z=latent)


RUN_SETTINGS = ("seed", "prompt", "device", "max_rows_per_pass", "constraint", "kv_cache",
                "stop_token")  # a run's own; the rest: the sampler's


def make_run(model, num_samples: int, steps: int, **settings) -> GenerationRun:
    """A ``GenerationRun`` from flat keyword settings: ``RUN_SETTINGS`` for the run, the rest for its
    ``SamplerConfig`` (ordering, schedule, eb_gamma, eb_proxy, temperature, contraction, joint, bernoulli)."""
    run_kw = {k: settings.pop(k) for k in RUN_SETTINGS if k in settings}
    return GenerationRun(model, num_samples, steps, SamplerConfig(**settings), **run_kw)


def generate(model, num_samples: int, steps: int, **settings):
    """Yield a ``StepState`` after every denoising step; the last one has ``done = True`` and holds the
    finished sequences (also the generator's return value). Settings: as ``make_run``."""
    run = make_run(model, num_samples, steps, **settings)
    state = None
    while not run.done:
        state = run.step()
        yield state
    return state.tokens if state is not None else run.tokens
