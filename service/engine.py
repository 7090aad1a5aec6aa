"""The engine: admission, step-level continuous batching and cancellation. It knows runs and tokens,
not HTTP: each request's outputs are typed (``StepOutput``, ``EngineError``); ``serving`` turns them
into answers.

Every checkpoint has a batcher: a loop that, at each iteration, takes the admitted requests (up to
``max_batch_samples`` sequences) and advances each by one denoising step with ONE backbone forward pass
over all of their sequences (``ttcore.sampling.batch_step``), each with its own settings. Requests join
and leave between steps, so no request waits for another to finish. Work runs on one compute thread;
the event loop only moves outputs. A bounded number of admitted requests gives backpressure
(``Overloaded``); a cancelled request leaves at the next step.
"""

import asyncio
import itertools
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ttcore.sampling import GenerationRun, batch_step

from .metrics import Metrics
from .registry import LoadedModel

log = logging.getLogger("ttcore.engine")


class Overloaded(RuntimeError):
    pass


@dataclass
class StepOutput:
    """One denoising step of one request: ``tokens`` [b, l] after it (mask id where still masked), the
    positions each sequence committed in it, and whether the request is finished (``tokens`` final)."""
    step: int
    tokens: torch.Tensor
    committed: list[list[int]]
    model_calls: int
    finished: bool


@dataclass
class EngineError:
    """The step failed; the request is over. ``message`` is safe to show (exception type and text)."""
    message: str


@dataclass
class Job:
    lm: LoadedModel
    run: GenerationRun
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None  # first step began
    first_output: float | None = None
    cancelled: bool = False
    finished: bool = False


class _Batcher:
    """Continuous batching for one checkpoint."""

    def __init__(self, engine: "Engine", lm: LoadedModel):
        self.engine, self.lm = engine, lm
        self.jobs: list[Job] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self._rotation = itertools.count()

    def add(self, job: Job) -> None:
        self.jobs.append(job)
        self.wake.set()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.lm.name}")

    def _select(self) -> list[Job]:
        """Up to max_batch_samples sequences; the start rotates so no request starves."""
        jobs = self.jobs
        if not jobs:
            return []
        start = next(self._rotation) % len(jobs)
        batch, total = [], 0
        for job in jobs[start:] + jobs[:start]:
            n = job.run.tokens.shape[0]
            if batch and total + n > self.engine.max_batch_samples:
                continue
            batch.append(job)
            total += n
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for job in [j for j in self.jobs if j.cancelled]:
                self._finish(job, cancelled=True)
            if not self.jobs:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = self._select()
            try:
                outputs = await loop.run_in_executor(self.engine.executor, self._step, batch)
            except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                log.exception("engine step failed for %s", self.lm.name)
                for job in batch:
                    job.outputs.put_nowait(EngineError(f"{type(e).__name__}: {e}"))
                    self._finish(job)
                continue
            now = time.perf_counter()
            for job, out in zip(batch, outputs):
                if job.first_output is None:
                    job.first_output = now
                    self.engine.metrics.first_event.labels(self.lm.family).observe(now - job.arrived)
                job.outputs.put_nowait(out)
                if out.finished:
                    self._finish(job)

    def _finish(self, job: Job, cancelled: bool = False) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
            self.engine._release(job, cancelled)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """The batch's one backbone call, timed (on CUDA, to the end of its kernels)."""
        m, name = self.engine.metrics, self.lm.family
        t0 = time.perf_counter()
        h = self.lm.model.features(x)  # [sum b, l, d]
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        m.forward_seconds.labels(name).inc(time.perf_counter() - t0)
        m.forward_samples.labels(name).observe(x.shape[0])
        m.forward_requests.labels(name).observe(sum(job.run.needs_model for job in self._in_step))
        return h

    def _step(self, batch: list[Job]) -> list[StepOutput]:
        """One denoising step for every job in ``batch`` (compute thread)."""
        t0 = time.perf_counter()
        self._in_step = batch
        model = self.lm.model
        with model.compute_context():
            states = batch_step(model, [job.run for job in batch], forward=self._forward)
        outputs = []
        for job, state in zip(batch, states):
            if job.started is None:
                job.started = t0
            committed = [[] for _ in range(state.committed.shape[0])]
            for i, pos in state.committed.nonzero().tolist():  # one op for all rows, not one per row
                committed[i].append(pos)
            self.engine.metrics.tokens.labels(self.lm.family).inc(sum(map(len, committed)))
            outputs.append(StepOutput(state.step, state.tokens, committed, state.model_calls, job.run.done))
        self.engine.metrics.step_seconds.labels(self.lm.family).inc(time.perf_counter() - t0)
        return outputs


class Engine:
    """Runs ``GenerationRun``s of loaded models: ``submit`` / ``outputs`` / ``abort`` / ``check_health``."""

    def __init__(self, *, max_batch_samples: int = 256, max_requests: int = 64, threads: int | None = None,
                 metrics: Metrics | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.max_batch_samples, self.max_requests = max_batch_samples, max_requests
        self.metrics = metrics or Metrics()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttcore-compute")
        self._batchers: dict[str, _Batcher] = {}
        self._jobs: dict[str, Job] = {}

    def check_health(self) -> bool:
        return all(b.task is None or not b.task.done() for b in self._batchers.values())

    def submit(self, lm: LoadedModel, run: GenerationRun) -> Job:
        """Admit a run of ``lm`` (raises Overloaded). Must run on the event loop."""
        if len(self._jobs) >= self.max_requests:
            self.metrics.rejected.inc()
            raise Overloaded(f"{len(self._jobs)} requests in flight (the limit is {self.max_requests})")
        job = Job(lm, run)
        self._jobs[job.id] = job
        self.metrics.queue_depth.set(len(self._jobs))
        batcher = self._batchers.get(lm.name)
        if batcher is None:
            batcher = self._batchers[lm.name] = _Batcher(self, lm)
        batcher.add(job)
        return job

    async def outputs(self, job: Job):
        """Async generator of the job's ``StepOutput``s until the finished one (or an ``EngineError``);
        closing it early cancels the job."""
        try:
            while True:
                out = await job.outputs.get()
                yield out
                if isinstance(out, EngineError) or out.finished:
                    return
        finally:
            if not job.finished:
                self.abort(job.id)

    def abort(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.cancelled = True
            batcher = self._batchers.get(job.lm.name)
            if batcher is not None:
                batcher.wake.set()

    def _release(self, job: Job, cancelled: bool) -> None:
        job.finished = True
        self._jobs.pop(job.id, None)
        self.metrics.queue_depth.set(len(self._jobs))
        if cancelled:
            self.metrics.cancelled.inc()

    def shutdown(self) -> None:
        for b in self._batchers.values():
            if b.task is not None:
                b.task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)
