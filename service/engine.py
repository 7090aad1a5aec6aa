"""The engine: admission to the request slots, deadlines, cancellation and drains. It knows runs and tokens,
not HTTP: each request's outputs are typed (``StepOutput``, ``EngineError``); ``serving`` turns them into
answers.

Every checkpoint has a batcher (``service.batcher``): its loop advances the admitted requests by one denoising
step with ONE backbone forward pass over all of their sequences, then runs at most one queued piece of other
work; requests join and leave between steps, so no request waits for another to finish. Limits: a bounded
number of admitted requests (``Overloaded``, with the estimated seconds of work ahead as the retry hint); a
deadline per request (past it: ``EngineError`` with kind ``timeout``); a bounded backlog of unread outputs per
request (a reader that falls behind pauses its request; one that stops reading for ``reader_timeout_s`` is
cancelled); a cancelled request leaves at the next step.
"""

import logging
import math
import time

import torch

from ttcore.distributions import compile_streams
from ttcore.sampling import GenerationRun

from .batcher import CALIBRATION_STALL_S, Batcher, EngineError, Job
from .config import ServiceArgs
from .metrics import Metrics
from .refusals import Overloaded
from .registry import LoadedModel

log = logging.getLogger("ttcore.engine")

DRAIN_RETRY_AFTER_S = 5  # what a draining server's 503 tells a client (another replica, or this one restarted)
SHUTDOWN_MESSAGE = "the server shut down before the request finished (its drain timed out): retry it elsewhere"


class Engine:
    """Runs ``GenerationRun``s of loaded models: ``submit`` / ``outputs`` / ``abort`` / ``check_health``."""

    def __init__(self, args: ServiceArgs | None = None, metrics: Metrics | None = None):
        args = args or ServiceArgs()
        if args.threads:
            torch.set_num_threads(args.threads)
        self.max_batch_samples, self.max_requests = args.max_batch_samples, args.max_requests
        self.stall_s, self.reader_timeout_s = args.stall_s, args.reader_timeout_s
        self.release_idle_memory, self.cuda_graphs = args.release_idle_memory, args.cuda_graphs
        self.draining = False  # set on shutdown (``service.__main__``): new requests are refused with 503
        compile_streams("cuda", enabled=args.compile_streams)  # only CUDA tensors draw through it
        self.metrics = metrics or Metrics()
        self._batchers: dict[str, Batcher] = {}
        self._jobs: dict[str, Job] = {}

    def check_health(self) -> tuple[bool, str]:
        """(healthy, why not): every batcher loop alive, and no worker on one step longer than ``stall_s``."""
        now = time.perf_counter()
        for name, b in self._batchers.items():
            if b.task is not None and b.task.done():
                return False, f"the batcher of {name} stopped"
            if b.busy_since is not None and now - b.busy_since > self.stall_s:
                return False, f"the worker of {name} has been on one step for {now - b.busy_since:.0f} s"
            limit = max(CALIBRATION_STALL_S, self.stall_s)
            if b.calibrating_since is not None and now - b.calibrating_since > limit:
                took = now - b.calibrating_since
                return False, f"the worker of {name} has been timing a kind of work for {took:.0f} s"
        return True, "ok"

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished (generation and /score)."""
        return len(self._jobs)

    def idle(self, lm: LoadedModel) -> bool:
        """Whether ``lm`` has no request in flight (admission runs an unmeasured kind's first request then)."""
        batcher = self._batchers.get(lm.name)
        return batcher is None or (not batcher.jobs and not batcher.pieces and batcher.busy_since is None
                                   and batcher.calibrating_since is None)

    def submit(self, lm: LoadedModel, run: GenerationRun, cost_s: float = 0.0,
               timeout_s: float = float("inf"), work=None) -> Job:
        """Admit a run of ``lm`` (raises Overloaded). Must run on the event loop. ``work``: its
        ``admission.Work``; when given, its measured time corrects ``lm.speed`` once it finishes."""
        job = self.reserve(lm, cost_s, timeout_s, work)
        job.run = run
        batcher = self._batchers.get(lm.name)
        if batcher is None:
            batcher = self._batchers[lm.name] = Batcher(self, lm)
        batcher.add(job)
        return job

    def reserve(self, lm: LoadedModel, cost_s: float = 0.0, timeout_s: float = float("inf"),
                work=None) -> Job:
        """A slot among the ``max_requests`` in flight (raises Overloaded), for a job without a run: work that
        runs its own pieces on the model's worker (``run_on_worker``: /score) counts against the same limit as
        generation and is aborted the same way (``job.cancelled``). ``submit`` gives the slot a run; other work
        gives it back with ``release``."""
        if self.draining:
            self.metrics.rejected.inc()
            raise Overloaded("the server is shutting down (draining: requests in flight finish, new ones go to "
                             "another replica)", DRAIN_RETRY_AFTER_S)
        if len(self._jobs) >= self.max_requests:
            self.metrics.rejected.inc()
            first_free = min(job.remaining_s for job in self._jobs.values())  # when a slot frees up
            retry = max(1, min(3600, math.ceil(first_free)))
            raise Overloaded(f"{len(self._jobs)} requests in flight (the limit is {self.max_requests})", retry)
        job = Job(lm, None, cost_s, timeout_s, work)
        self._jobs[job.id] = job
        self.metrics.queue_depth.set(len(self._jobs))
        return job

    def release(self, job: Job) -> None:
        """Give back a reserved job's slot (its work is done, failed or cancelled)."""
        self._release(job, job.cancelled)

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

    async def run_on_worker(self, lm: LoadedModel, fn, calibration: bool = False):
        """Run ``fn()`` on ``lm``'s worker thread, between its denoising steps (scoring uses the model too): queued,
        and run after the next step of the model's batch (``Batcher._loop``: one piece between two steps).
        ``calibration``: the server timing a kind of work (``Speed.ensure``), which /health does not count as a
        stalled step (a first timing of an exact contraction took 10 s on a loaded machine) unless it passes
        ``CALIBRATION_STALL_S``."""
        batcher = self._batchers.get(lm.name)
        if batcher is None:
            batcher = self._batchers[lm.name] = Batcher(self, lm)
        return await batcher.add_piece(fn, calibration)

    def cut(self, message: str) -> int:
        """End every request in flight now, each with ``EngineError(message, "shutdown")`` (a stream's last event
        says so; a /score request's next piece refuses with 503): a drain past its timeout. -> requests cut."""
        cut = list(self._jobs.values())
        for job in cut:
            job.shutdown = job.cancelled = True
            batcher = self._batchers.get(job.lm.name)
            if job.run is not None and batcher is not None and job in batcher.jobs:
                batcher.jobs.remove(job)
                job.outputs.put_nowait(EngineError(message, "shutdown"))
                self._release(job, cancelled=False)
        return len(cut)

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
            b.executor.shutdown(wait=False, cancel_futures=True)
