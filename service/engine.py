"""The engine: loaded checkpoints and step-level continuous batching.

Every checkpoint has a batcher: a loop that, at each iteration, takes the admitted requests (up to
``max_batch_samples`` sequences), runs ONE backbone forward pass over all of their sequences, and
advances each request by one denoising step with its own settings (ordering, sampler, steps, seed).
Requests join and leave between steps, so no request waits for another to finish. Work runs on one
compute thread; the event loop only moves events. A bounded number of admitted requests gives
backpressure (``Overloaded`` -> HTTP 503); a cancelled request leaves at the next step.
"""

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ttcore.models import CheckpointError, load_checkpoint
from ttcore.sampling import GenerationRun, step_together

from .metrics import Metrics
from .schema import GenerateRequest, GenerateResponse, ModelInfo, Sample, StepEvent, Timings

log = logging.getLogger("ttcore.engine")


class ModelNotFound(LookupError):
    def __init__(self, message: str, available: list[dict]):
        super().__init__(message)
        self.available = available


class PromptError(ValueError):
    pass


class Overloaded(RuntimeError):
    pass


@dataclass
class LoadedModel:
    name: str
    family: str
    domain: str
    model: torch.nn.Module
    tokenizer: object
    info: ModelInfo


@dataclass
class Job:
    request: GenerateRequest
    lm: LoadedModel
    run: GenerationRun
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_event: float | None = None
    cancelled: bool = False
    finished: bool = False


def _preference(info: ModelInfo) -> tuple:
    return ({"tt": 2, "cp": 1, "none": 0}[info.decomposition], info.rank)


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
                results = await loop.run_in_executor(self.engine.executor, self._step, batch)
            except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                log.exception("engine step failed for %s", self.lm.name)
                for job in batch:
                    job.events.put_nowait(("error", {"id": job.id, "error": f"{type(e).__name__}: {e}"}))
                    self._finish(job)
                continue
            now = time.perf_counter()
            for job, events in results:
                if job.first_event is None:
                    job.first_event = now
                    self.engine.metrics.first_event.labels(self.lm.family).observe(now - job.arrived)
                for ev in events:
                    if ev[0] == "done":
                        ev[1]["timings"] = Timings(queue_ms=1e3 * (job.started - job.arrived),
                                                   first_event_ms=1e3 * (job.first_event - job.arrived),
                                                   total_ms=1e3 * (now - job.arrived)).model_dump()
                    job.events.put_nowait(ev)
                if job.run.done:
                    self._finish(job)

    def _finish(self, job: Job, cancelled: bool = False) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
            self.engine._release(job, cancelled)

    @contextlib.contextmanager
    def _compute_mode(self, device: torch.device):
        """Inference mode, and bf16 autocast when serving bf16 (the linears then hold bf16 weights)."""
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16,
                                                    enabled=self.engine.precision == "bf16"):
            yield

    def _step(self, batch: list[Job]) -> list[tuple[Job, list]]:
        """One denoising step for every job in ``batch`` with one shared forward pass (compute thread)."""
        t0 = time.perf_counter()
        m, name = self.engine.metrics, self.lm.family
        need = [job for job in batch if job.run.prepare()]
        features = {}
        if need:
            x = torch.cat([job.run.tokens for job in need])  # [sum b, l]
            tf = time.perf_counter()
            with self._compute_mode(x.device):
                h = self.lm.model.features(x)  # [sum b, l, d]
            if x.is_cuda:  # kernels run asynchronously: time the forward pass, not its launch
                torch.cuda.synchronize(x.device)
            m.forward_seconds.labels(name).inc(time.perf_counter() - tf)
            m.forward_samples.labels(name).observe(x.shape[0])
            m.forward_requests.labels(name).observe(len(need))
            features = dict(zip(map(id, need), h.float().split([job.run.tokens.shape[0] for job in need])))
        with self._compute_mode(self.engine.device):  # one joint draw for the jobs that can share it
            states = step_together([job.run for job in batch], [features.get(id(job)) for job in batch])
        out = []
        for job, state in zip(batch, states):
            if job.started is None:
                job.started = t0
            tok = self.lm.tokenizer
            committed = [[] for _ in range(state.committed.shape[0])]
            for i, pos in state.committed.nonzero().tolist():  # one op for all rows, not one per row
                committed[i].append(pos)
            events = [("step", StepEvent(step=state.step, sequences=[tok.decode(row) for row in state.tokens.tolist()],
                                         committed=committed).model_dump())]
            m.tokens.labels(name).inc(sum(map(len, committed)))
            if job.run.done:
                events.append(("done", self._answer(job, state)))
            out.append((job, events))
        m.step_seconds.labels(name).inc(time.perf_counter() - t0)
        return out

    def _answer(self, job: Job, state) -> dict:
        tok, lm = self.lm.tokenizer, self.lm
        samples = []
        check = smiles_checker() if lm.domain == "smiles" else None
        for row in state.tokens.tolist():
            text = tok.decode(row)
            if check is not None:
                c = check(text)
                samples.append(Sample(text=text, valid=c is not None, canonical=c))
            else:
                samples.append(Sample(text=text))
        m = self.engine.metrics
        m.samples.labels(lm.family).inc(len(samples))
        m.steps.labels(lm.family).inc(state.step)
        m.model_calls.observe(state.model_calls)
        return GenerateResponse(id=job.id, model=lm.family, checkpoint=lm.name, decomposition=lm.info.decomposition,
                                rank=lm.info.rank, samples=samples, steps=state.step, model_calls=state.model_calls,
                                timings=Timings(queue_ms=0, first_event_ms=0, total_ms=0)).model_dump()


@functools.cache
def smiles_checker():
    """RDKit's canonical form (None for an invalid SMILES), or None where RDKit is not installed: a
    server without the `chem` extra still serves SMILES, with `valid` and `canonical` left null."""
    try:
        from ttcore.metrics.molecules import canonical
    except ImportError as e:
        log.warning("RDKit is not importable (%s; pip install '.[chem]'): SMILES answers carry valid=null", e)
        return None
    return canonical


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 where bf16 matmuls are native (a CUDA device that supports them; a CPU with
    AVX512-BF16 or AMX, read from /proc/cpuinfo), fp32 elsewhere. The quality tables are measured in
    bf16; on this project's CPUs bf16 serves 1.3-1.5x the molecules/s of fp32 (README)."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "fp32"
    return "bf16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "fp32"


class Engine:
    """Loads every checkpoint under a directory and serves generation requests (``submit`` /
    ``events`` / ``abort`` / ``check_health``)."""

    def __init__(self, checkpoints: str | Path, *, device: str = "cpu", max_batch_samples: int = 256,
                 max_requests: int = 64, precision: str = "auto", threads: int | None = None,
                 metrics: Metrics | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.precision = resolve_precision(precision, self.device)
        log.info("precision %s (asked: %s)", self.precision, precision)
        self.max_batch_samples, self.max_requests = max_batch_samples, max_requests
        self.metrics = metrics or Metrics()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttcore-compute")
        self.models: list[LoadedModel] = []
        self.refused: dict[str, str] = {}
        self._batchers: dict[str, _Batcher] = {}
        self._jobs: dict[str, Job] = {}
        self._load(Path(checkpoints))

    def _load(self, root: Path) -> None:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
        if not dirs:
            log.error("no checkpoints under %s", root)
        for d in dirs:
            try:
                model, tok, config = load_checkpoint(d, device=self.device)
                if self.precision == "bf16":
                    model.cast_linears_(torch.bfloat16)  # cast once, not by autocast on every call
            except (CheckpointError, OSError, ValueError) as e:
                # public reason: names relative to the checkpoint directory, never this machine's paths
                self.refused[d.name] = str(e).replace(str(d.resolve()), d.name).replace(str(d), d.name)
                log.error("refusing checkpoint %s: %s", d, e)
                continue
            cfg = model.cfg
            family = cfg.extra.get("family", "qm9" if tok.kind == "smiles" else tok.kind)
            card = (d / "model_card.md").read_text() if (d / "model_card.md").exists() else None
            info = ModelInfo(model=family, checkpoint=d.name, domain=tok.kind, decomposition=cfg.decomposition,
                             rank=cfg.rank, head=cfg.head if cfg.decomposition != "none" else "base",
                             length=cfg.dit.length, vocab_size=cfg.dit.out_vocab,
                             parameters=sum(p.numel() for p in model.parameters()), card=card)
            self.models.append(LoadedModel(d.name, family, tok.kind, model, tok, info))
            if tok.kind == "smiles":
                smiles_checker()  # says at start-up, not at the first answer, when RDKit is missing
            log.info("loaded %s: %s %s r=%d", d.name, family, cfg.decomposition, cfg.rank)

    # --- queries

    def model_infos(self) -> list[ModelInfo]:
        return [lm.info for lm in self.models]

    def check_health(self) -> bool:
        return all(b.task is None or not b.task.done() for b in self._batchers.values())

    @property
    def ready(self) -> bool:
        return bool(self.models)

    def resolve(self, family: str | None, decomposition: str | None, rank: int | None) -> LoadedModel:
        """The checkpoint for (family, decomposition, rank); defaults pick the best available."""
        if not self.models:
            raise ModelNotFound("no checkpoints are loaded", [])
        family = family or self.models[0].family
        pool = [lm for lm in self.models if lm.family == family
                and (decomposition is None or lm.info.decomposition == decomposition)
                and (rank is None or lm.info.rank == rank)]
        if not pool:
            available = [{"model": lm.family, "decomposition": lm.info.decomposition, "rank": lm.info.rank}
                         for lm in self.models]
            want = f"model={family!r}, decomposition={decomposition!r}, rank={rank!r}"
            have = "; ".join(f"{a['model']}/{a['decomposition']}/r{a['rank']}" for a in available)
            raise ModelNotFound(f"no loaded checkpoint matches {want}; available: {have}", available)
        return max(pool, key=lambda lm: _preference(lm.info))

    def encode_prompt(self, lm: LoadedModel, prompt: str) -> torch.Tensor:
        tok = lm.tokenizer
        try:
            ids = tok.tokenize(prompt, allow_mask=True)
        except ValueError as e:
            raise PromptError(str(e)) from None
        if len(ids) > tok.length:
            raise PromptError(f"prompt has {len(ids)} tokens, more than the model length {tok.length}")
        return torch.tensor(ids + [tok.mask_id] * (tok.length - len(ids)), dtype=torch.long)

    # --- requests

    def submit(self, request: GenerateRequest) -> Job:
        """Admit a request (raises ModelNotFound, PromptError, Overloaded). Must run on the event loop."""
        lm = self.resolve(request.model, request.decomposition, request.rank)
        prompt = self.encode_prompt(lm, request.prompt) if request.prompt else None
        if len(self._jobs) >= self.max_requests:
            self.metrics.rejected.inc()
            raise Overloaded(f"{len(self._jobs)} requests in flight (the limit is {self.max_requests})")
        run = GenerationRun(lm.model, request.num_samples, request.steps, prompt=prompt, device=self.device,
                            **request.sampler_settings())
        job = Job(request, lm, run)
        self._jobs[job.id] = job
        self.metrics.queue_depth.set(len(self._jobs))
        batcher = self._batchers.get(lm.name)
        if batcher is None:
            batcher = self._batchers[lm.name] = _Batcher(self, lm)
        batcher.add(job)
        return job

    async def events(self, job: Job):
        """Async generator of (event, payload) until ``done`` or ``error``; closing it cancels the job."""
        try:
            while True:
                event = await job.events.get()
                yield event
                if event[0] in ("done", "error"):
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
