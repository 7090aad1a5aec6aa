"""The generation loop: K denoising steps, one backbone call each, a state yielded after every step.

``GenerationRun`` holds one request's state and advances one step at a time; ``generate`` drives it.
The split lets a server batch the backbone calls of many runs (``prepare`` tells whether a step needs
the model; ``step(h)`` accepts features computed elsewhere).
"""

import time
from dataclasses import dataclass

import torch

from ttcore.distributions import RowStreams
from ttcore.models.vadd import prior_sample

from .config import SamplerConfig
from .joint_step import predetermined_step
from .schedules import SCHEDULES


@dataclass
class StepState:
    tokens: torch.Tensor  # [b, l], [MASK] id where still masked
    committed: torch.Tensor  # [b, l] bool: positions unmasked by this step
    step: int  # steps taken so far (1-based after the first)
    model_calls: int  # backbone calls so far
    done: bool  # True on the final state: tokens hold the finished sequences


class GenerationRun:
    """One generation request: its sampler (``SamplerConfig``), RNG and the partially unmasked sequences.
    ``seed``: the run's own generator; ``prompt`` [l] or [b, l]: known tokens, [MASK] elsewhere;
    ``max_rows_per_pass``: micro-batches of sequences bound a step's memory."""

    def __init__(self, model, num_samples: int, steps: int, config: SamplerConfig | None = None, *,
                 seed: int | None = None, prompt: torch.Tensor | None = None,
                 device: str | torch.device | None = None, max_rows_per_pass: int | None = None):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if max_rows_per_pass is not None and max_rows_per_pass < 1:
            raise ValueError(f"max_rows_per_pass must be >= 1, got {max_rows_per_pass}")
        self.config = config = config or SamplerConfig()
        self.sampler = config.step  # the step's whole rule: counts, choice, draw (``ttcore.sampling.steps``)
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.steps, self.schedule = steps, SCHEDULES[config.schedule]
        self.max_rows_per_pass = max_rows_per_pass
        self.mask_id = model.cfg.dit.vocab_size - 1
        length = model.cfg.dit.length
        self.generator = torch.Generator(self.device)
        self.generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
        # a VADD model: z ~ p(z) once per sequence, first from the run's own stream, fixed through the steps
        latent_dim = getattr(model.cfg.dit, "latent_dim", 0)
        self.latent = prior_sample(num_samples, latent_dim, self.generator, self.device) if latent_dim else None
        if prompt is None:
            self.tokens = torch.full((num_samples, length), self.mask_id, dtype=torch.long, device=self.device)
        else:
            prompt = prompt.to(self.device, torch.long)
            if prompt.shape[-1] != length or prompt.dim() not in (1, 2):
                raise ValueError(f"prompt must have shape [{length}] or [b, {length}], got {tuple(prompt.shape)}")
            if int(prompt.min()) < 0 or int(prompt.max()) > self.mask_id:
                raise ValueError(f"prompt ids must lie in [0, {self.mask_id}]")
            self.tokens = prompt.expand(num_samples, length).clone() if prompt.dim() == 1 else prompt.clone()
        self.n_initial = (self.tokens == self.mask_id).sum(1)
        self.plan = self.sampler.plan(self)  # what the step keeps for the run (a predetermined order's priorities)
        self.step_index, self.model_calls = 0, 0
        self._counts, self._needed = None, None  # set by prepare() for the coming step

    @property
    def done(self) -> bool:
        return self.step_index >= self.steps or not bool((self.tokens == self.mask_id).any())

    def prepare(self) -> bool:
        """Fix this step's unmasking counts; False when the step unmasks nothing (no model call)."""
        self._counts = self.sampler.counts(self, (self.tokens == self.mask_id).sum(1))
        self._needed = self._counts is None or bool(self._counts.any())
        return self._needed

    @torch.inference_mode()
    def step(self, h: torch.Tensor | None = None) -> StepState:
        """Advance one denoising step. ``h`` [b, l, d]: features of ``self.tokens`` if computed by the
        caller (batched with other runs); otherwise the model is called here when needed."""
        if self._needed is None:
            self.prepare()
        masked = self.tokens == self.mask_id
        values = torch.full_like(self.tokens, -1)
        if self._needed:
            if h is None:
                h = features(self.model, self.tokens, self.latent)
            step = self.max_rows_per_pass or len(self.tokens)
            for s in range(0, len(self.tokens), step):  # micro-batches of sequences bound the step's memory
                rows = slice(s, s + step)
                counts = None if self._counts is None else self._counts[rows]
                chosen = self.sampler.choose(self, h[rows], self.tokens[rows], masked[rows], counts, rows)
                values[rows] = self.sampler.draw(self, h[rows], self.tokens[rows], masked[rows], chosen, counts)
        return self._commit(values)

    @property
    def needs_model(self) -> bool:
        """Whether the prepared step calls the model (False before ``prepare``)."""
        return bool(self._needed)

    @property
    def joins_batch(self) -> bool:
        """Whether this step can share its joint draw with other runs (``step_together``): a model call whose
        draw is a predetermined joint draw (the set T fixed by the ordering, or chosen by the run alone first),
        by a run that fits one pass."""
        fits = self.max_rows_per_pass is None or len(self.tokens) <= self.max_rows_per_pass
        return bool(self._needed) and self.sampler.batchable and fits

    def step_set(self, h: torch.Tensor) -> torch.Tensor:
        """This step's set T [b, l] bool when its draw is shared (``joins_batch``): the step's ``choose`` over all
        the run's sequences (fixed by the ordering, or chosen from this run's features ``h``)."""
        return self.sampler.choose(self, h, self.tokens, self.tokens == self.mask_id, self._counts, slice(None))

    def _commit(self, values: torch.Tensor) -> StepState:
        committed = values >= 0
        self.model_calls += int(bool(self._needed))
        self.tokens = torch.where(committed, values, self.tokens)
        self.step_index += 1
        self._counts, self._needed = None, None
        return StepState(self.tokens.clone(), committed, self.step_index, self.model_calls, self.done)


def _passes(runs: list[GenerationRun], members: list[int]) -> list[list[int]]:
    """A group split into passes (in order) whose sequences never exceed the smallest ``max_rows_per_pass``
    of the runs in the pass."""
    out, current, rows, limit = [], [], 0, float("inf")
    for i in members:
        n, cap = runs[i].tokens.shape[0], runs[i].max_rows_per_pass or float("inf")
        if current and rows + n > min(limit, cap):
            out.append(current)
            current, rows, limit = [], 0, float("inf")
        current.append(i)
        rows, limit = rows + n, min(limit, cap)
    return out + [current]


@torch.inference_mode()
def step_together(runs: list[GenerationRun], features: list[torch.Tensor | None]) -> list[StepState]:
    """One step of several runs, given each run's features (computed in one batch).

    Runs whose step is a predetermined joint draw (``joins_batch``: predetermined orderings, and the fast
    adaptive path once each run has chosen its set) with the same model, temperature and contraction share
    one ``predetermined_step``: one head call, one softmax and one sampling pass for all their rows, each
    run drawing from its own generator (``RowStreams``), so every run gets exactly the tokens it would get
    alone. The rest (the chain rule, exact EB-Sampler, the marginal view, no-op steps) step one by one."""
    for run in runs:
        if run._needed is None:
            run.prepare()
    groups: dict[tuple[int, float, str], list[int]] = {}  # (model, temperature, contraction) -> runs
    for i, run in enumerate(runs):
        if run.joins_batch and features[i] is not None:
            groups.setdefault((id(run.model), run.config.temperature, run.config.contraction), []).append(i)
    states: list[StepState | None] = [None] * len(runs)
    passes = [(t, c, part) for (_, t, c), members in groups.items() for part in _passes(runs, members)]
    for temperature, contraction, members in passes:
        if len(members) == 1:
            continue
        group = [runs[i] for i in members]
        x = torch.cat([run.tokens for run in group])  # [sum b, l]
        masked = x == group[0].mask_id
        streams = RowStreams([run.generator for run in group], [run.tokens.shape[0] for run in group], x.device)
        values = predetermined_step(group[0].model, torch.cat([features[i] for i in members]), x, masked,
                                    torch.cat([run.step_set(features[i]) for i, run in zip(members, group)]),
                                    temperature, streams, contraction)
        for i, run, v in zip(members, group, values.split([run.tokens.shape[0] for run in group])):
            states[i] = run._commit(v)
    return [state if state is not None else run.step(h) for run, h, state in zip(runs, features, states)]


@dataclass
class BatchStep:
    """What ``batch_step`` did: each run's new state, and its one backbone call as measured."""
    states: list[StepState]  # one per run, in order
    in_forward: list[bool]  # per run: whether its sequences went through the backbone call
    forward_rows: int  # sequences in the backbone call (0: no run needed the model)
    forward_seconds: float  # wall time of the backbone call (on CUDA, to the end of its kernels)
    seconds: float  # wall time of the whole step (on CUDA, to the end of the forward's kernels only)


def batch_step(model, runs: list[GenerationRun]) -> BatchStep:
    """One denoising step of several runs of ``model`` with ONE backbone call over the sequences of every
    run whose step needs the model (``prepare``), then ``step_together``. Run it under
    ``model.compute_context()``. This is the loop body of the service's continuous batching; every run gets
    exactly the tokens it would get alone. Returns the states with the forward's timing (``BatchStep``)."""
    t0 = time.perf_counter()
    need = [run for run in runs if run.prepare()]
    computed, forward_s, rows = {}, 0.0, 0
    if need:
        x = torch.cat([run.tokens for run in need])  # [sum b, l]
        latent = torch.cat([run.latent for run in need]) if need[0].latent is not None else None
        if x.is_cuda:  # the forward's own time: what was queued before it finishes first
            torch.cuda.synchronize(x.device)
        t1 = time.perf_counter()
        h = features(model, x, latent)  # [sum b, l, d]
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        forward_s, rows = time.perf_counter() - t1, x.shape[0]
        computed = dict(zip(map(id, need), h.float().split([run.tokens.shape[0] for run in need])))
    states = step_together(runs, [computed.get(id(run)) for run in runs])
    return BatchStep(states, [id(run) in computed for run in runs], rows, forward_s, time.perf_counter() - t0)


def features(model, tokens: torch.Tensor, latent: torch.Tensor | None) -> torch.Tensor:
    """The backbone call of a step: ``model.features(tokens)``, with the sequences' VADD latents if any."""
    return model.features(tokens) if latent is None else model.features(tokens, z=latent)


RUN_SETTINGS = ("seed", "prompt", "device", "max_rows_per_pass")  # a run's own; the rest are the sampler's


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
