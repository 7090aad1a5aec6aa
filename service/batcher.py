"""One checkpoint's batcher: a loop that, at each iteration, takes the admitted requests in arrival order (first
come, first served, up to ``max_batch_samples`` sequences) and advances each by one denoising step with ONE
backbone forward pass over all of their sequences (``ttcore.sampling.batch_step``), each with its own settings,
then runs at most one queued piece of other work (/score, timing). It computes on its own worker thread; the
event loop only moves outputs. The requests it steps (``Job``) and what each step gives (``StepOutput``,
``EngineError``); the ``Engine`` admits them."""

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ttcore.sampling import GenerationRun, batch_step
from ttcore.sampling.graphs import ForwardGraphs

from .registry import LoadedModel

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("ttcore.engine")

MAX_BACKLOG = 8  # unread outputs per request before its request pauses
CALIBRATION_STALL_S = 120.0  # timing a kind of work (the server's own, a few steps) counts as stalled only past this
IDLE_RELEASE_S = 1.0  # a model's queue empty this long: the memory its requests freed goes back to the OS


def _libc_trim():
    """glibc's ``malloc_trim`` (None elsewhere: musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _libc_trim()


def release_freed_memory() -> None:
    """Return the memory the allocator keeps after requests to the OS. PyTorch's CPU tensors come from malloc,
    and glibc keeps what they free in per-thread arenas, sized by the largest shapes a server has seen: a
    hostile probe of varied request shapes grew a server from 487 MB to 1.65 GB, and it stayed there when
    idle. ``malloc_trim(0)`` returns the free pages of every arena (measured: ``benchmarks/idle_memory.py``);
    CUDA's caching allocator keeps its own pool, emptied with ``torch.cuda.empty_cache``."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class StepOutput:
    """One denoising step of one request: ``tokens`` [b, l] after it (mask id where still masked), the
    positions each sequence committed in it, and whether the request is finished (``tokens`` final)."""
    step: int
    tokens: torch.Tensor
    committed: list[list[int]]
    model_calls: int
    finished: bool

    @property
    def sends(self) -> bool:
        """Whether a stream sends an event for this step: it committed a position or finished (an idle step,
        when a request has more steps than positions, sends nothing: a stream has at most one event a position)."""
        return self.finished or any(map(len, self.committed))


@dataclass
class EngineError:
    """The request is over without an answer: ``kind`` is ``timeout`` (its deadline passed), ``cancelled``
    (its client went away or stopped reading), ``shutdown`` (the server's drain timed out: ``Engine.cut``) or
    ``failed`` (a step raised); ``message`` is safe to show."""
    message: str
    kind: str = "failed"


@dataclass
class Job:
    lm: LoadedModel
    run: GenerationRun | None  # None: a reserved slot whose work runs its own pieces (/score)
    cost_s: float = 0.0  # estimated compute of the whole request (admission)
    timeout_s: float = float("inf")
    work: object = None  # its admission.Work (kind and scale): the estimate its measured time corrects
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None  # first step began
    first_output: float | None = None
    cancelled: bool = False
    shutdown: bool = False  # ended by a drain past its timeout (``Engine.cut``)
    pieces_mark: int | None = None  # the worker's ``pieces_run`` at this request's last step
    finished: bool = False
    paused_since: float | None = None  # its backlog of unread outputs is full
    forward_s: float = 0.0  # its share of the backbone passes it took part in (split by sequences)
    sampling_s: float = 0.0  # its share of the rest of those steps: heads and joint draws
    overhead_steps: float = 0.0  # its share of those steps' sequences, summed (admission's per-step overhead)
    tokens_per_step: list[int] = field(default_factory=list)

    @property
    def remaining_s(self) -> float:
        """Time still ahead of this request: once it has taken steps, its own pace so far (wall time per
        step, queueing behind others included) times the steps left; before that, admission's estimate. A
        reserved job (no run: /score) has admission's estimate less the time it has run."""
        if self.run is None:
            return max(0.0, self.cost_s - (time.perf_counter() - self.arrived))
        working = min(self.run.steps, self.run.tokens.shape[1])  # steps that unmask anything: at most l
        done = sum(1 for n in self.tokens_per_step if n)  # idle steps (more steps than positions) cost nothing
        left = max(0, working - done)
        if self.started is not None and done > 0:
            return (time.perf_counter() - self.started) / done * left
        return self.cost_s * left / max(working, 1)


class Batcher:
    """Continuous batching for one checkpoint."""

    def __init__(self, engine: "Engine", lm: LoadedModel):
        self.engine, self.lm = engine, lm
        self.jobs: list[Job] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ttcore-{lm.name}")
        self.busy_since: float | None = None  # a step is running on the worker since then
        self.calibrating_since: float | None = None  # the server is timing a kind of work on the worker since then
        self.dirty = False  # steps ran since the queue was last empty (freed memory to give back)
        self.pieces: collections.deque = collections.deque()  # other work for the worker (``Engine.run_on_worker``)
        self.pieces_run = 0  # pieces the worker has run (a request's steps count those run between them)
        on_cuda = next(lm.model.parameters()).device.type == "cuda"
        self.forward = ForwardGraphs(lm.model) if on_cuda and engine.cuda_graphs else None  # None: eager

    def add(self, job: Job) -> None:
        self.jobs.append(job)
        self._start()

    def add_piece(self, fn, calibration: bool) -> asyncio.Future:
        """Queue ``fn`` for the worker (``Engine.run_on_worker``): -> a future of its result."""
        future = asyncio.get_running_loop().create_future()
        self.pieces.append((fn, future, calibration))
        self._start()
        return future

    def _start(self) -> None:
        self.wake.set()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.lm.name}")

    def _select(self) -> list[Job]:
        """In arrival order, up to max_batch_samples sequences; requests whose reader is behind wait."""
        batch, total = [], 0
        for job in self.jobs:
            n = job.run.tokens.shape[0]
            if job.outputs.qsize() >= MAX_BACKLOG or (batch and total + n > self.engine.max_batch_samples):
                continue
            batch.append(job)
            total += n
        return batch

    def _expire(self, now: float) -> None:
        """Cancelled, past-deadline and abandoned requests leave before the next step."""
        for job in list(self.jobs):
            if job.cancelled:
                self._finish(job, cancelled=True)
            elif now - job.arrived > job.timeout_s:
                job.outputs.put_nowait(EngineError(f"the request's deadline of {job.timeout_s:g} s passed after "
                                                   f"{job.run.step_index} of {job.run.steps} steps", "timeout"))
                self.engine.metrics.timeouts.labels(self.lm.family).inc()
                self._observe(job)  # what it ran corrects the estimate that let it in
                self._finish(job)
            elif job.outputs.qsize() >= MAX_BACKLOG:
                job.paused_since = job.paused_since or now
                if now - job.paused_since > self.engine.reader_timeout_s:
                    log.warning("request %s: its reader stopped reading; cancelled", job.id)
                    self._finish(job, cancelled=True)
            else:
                job.paused_since = None

    async def _loop(self) -> None:
        """The worker's schedule, fair by construction: each turn runs one denoising step of the batch (when any
        request can step), then at most one queued piece of other work (a /score piece, a timing), so a
        generation step runs between any two pieces, however many scores are queued."""
        loop = asyncio.get_running_loop()
        while True:
            self._expire(time.perf_counter())
            batch = self._select()
            stepping = {id(job) for job in batch}
            for job in self.jobs:  # a run that sits out this step lets its key-value cache go (an autoregressive
                if id(job) not in stepping:  # model's: its next step refills it), so caches held stay one batch's
                    job.run.kv = None
            if batch:
                await self._step_batch(loop, batch)
            if self.pieces:
                await self._run_piece(loop)
            elif not batch:
                self.wake.clear()
                if self.jobs:  # all paused (readers behind) or waiting: look again soon
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), 0.25)
                else:
                    if self.engine.release_idle_memory and self.dirty:  # idle for a while: give memory back
                        try:
                            await asyncio.wait_for(self.wake.wait(), IDLE_RELEASE_S)
                            continue  # new work came first
                        except asyncio.TimeoutError:
                            self.dirty = False
                            await loop.run_in_executor(self.executor, release_freed_memory)
                    if not self.jobs and not self.pieces:
                        await self.wake.wait()

    async def _run_piece(self, loop) -> None:
        """The oldest queued piece on the worker (one whose caller stopped waiting is dropped)."""
        fn, future, calibration = self.pieces.popleft()
        if future.done():  # its caller was cancelled meanwhile
            return
        attr = "calibrating_since" if calibration else "busy_since"
        setattr(self, attr, time.perf_counter())
        self.pieces_run += 1
        try:
            result = await loop.run_in_executor(self.executor, fn)
        except Exception as e:  # noqa: BLE001 - the caller's, raised where it awaits
            if not future.done():
                future.set_exception(e)
        else:
            if not future.done():
                future.set_result(result)
        finally:
            setattr(self, attr, None)
            self.dirty = True  # its freed memory is given back once idle

    async def _step_batch(self, loop, batch: list[Job]) -> None:
        """One denoising step of ``batch`` on the worker; its outputs to their requests."""
        self.busy_since, self.dirty = time.perf_counter(), True
        try:
            outputs = await loop.run_in_executor(self.executor, self._step, batch)
        except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
            log.exception("engine step failed for %s", self.lm.name)
            for job in batch:
                job.outputs.put_nowait(EngineError(f"{type(e).__name__}: {e}"))
                self._finish(job)
            return
        finally:
            self.busy_since = None
        now = time.perf_counter()
        for job, out in zip(batch, outputs):
            if job.pieces_mark is not None:  # other work the worker ran since this request's previous step
                self.engine.metrics.pieces_between_steps.labels(self.lm.family).observe(
                    self.pieces_run - job.pieces_mark)
            job.pieces_mark = self.pieces_run
            if job.first_output is None:
                job.first_output = now
                self.engine.metrics.first_event.labels(self.lm.family).observe(now - job.arrived)
            job.outputs.put_nowait(out)
            if out.finished:
                self._observe(job)
                self._finish(job)

    def _observe(self, job: Job) -> None:
        """Admission's estimates follow what requests really take (finished, or stopped by their deadline)."""
        if job.work is not None:
            self.lm.speed.observe(job.work, rows=job.run.tokens.shape[0],
                                  steps=sum(1 for n in job.tokens_per_step if n),  # idle steps are free
                                  seconds=job.forward_s + job.sampling_s, overhead_steps=job.overhead_steps)

    def _finish(self, job: Job, cancelled: bool = False) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
            self.engine._release(job, cancelled)
            if cancelled:  # whoever still waits on its outputs stops waiting
                job.outputs.put_nowait(EngineError("the request was cancelled", "cancelled"))

    def _step(self, batch: list[Job]) -> list[StepOutput]:
        """One denoising step for every job in ``batch`` (compute thread)."""
        t0 = time.perf_counter()
        model, m, name = self.lm.model, self.engine.metrics, self.lm.family
        for job in batch:  # steps that would unmask nothing are not run (each cost an engine iteration)
            job.run.skip_idle_steps()
        with model.compute_context():
            done = batch_step(model, [job.run for job in batch], self.forward)
        step_s = time.perf_counter() - t0
        states, forward_s = done.states, done.forward_seconds
        forward_jobs = {id(job) for job, took_part in zip(batch, done.in_forward) if took_part}
        if forward_jobs:
            m.forward_seconds.labels(name).inc(forward_s)
            m.forward_samples.labels(name).observe(done.forward_rows)
            m.forward_requests.labels(name).observe(len(forward_jobs))
        # each job's share of this step's time: the forward by the sequences it sent through the backbone, its
        # group's heads and joint draws by its sequences in that group (a cheap kind of work is not charged for
        # an expensive one beside it: admission learns each kind's cost from these), the little that is left
        # (counts, gathers) by its sequences in the step
        rows = {id(job): job.run.tokens.shape[0] for job in batch}
        shared = max(step_s - forward_s - sum(done.group_seconds), 0.0)
        forward_rows = sum(rows[i] for i in forward_jobs) or 1
        # one copy to the host for the whole step (on CUDA, one sync instead of two per job); the event
        # loop then only ever touches CPU tensors
        sizes = [state.tokens.shape[0] for state in states]
        host_tokens, host_committed = done.tokens.cpu().split(sizes), done.committed.cpu().split(sizes)
        outputs = []
        for job, state, tokens, committed_mask, own in zip(batch, states, host_tokens, host_committed,
                                                           done.group_seconds):
            if job.started is None:
                job.started = t0
            share = rows[id(job)]
            job.forward_s += forward_s * share / forward_rows if id(job) in forward_jobs else 0.0
            job.sampling_s += own + shared * share / sum(rows.values())
            job.overhead_steps += share / forward_rows if id(job) in forward_jobs else 0.0
            committed = [[] for _ in range(state.committed.shape[0])]
            for i, pos in committed_mask.nonzero().tolist():  # one op for all rows, not one per row
                committed[i].append(pos)
            job.tokens_per_step.append(sum(map(len, committed)))
            self.engine.metrics.tokens.labels(self.lm.family).inc(job.tokens_per_step[-1])
            outputs.append(StepOutput(state.step, tokens, committed, state.model_calls, job.run.done))
        self.engine.metrics.step_seconds.labels(self.lm.family).inc(step_s)
        return outputs
