"""Serving: a request in, answers out. Resolves the checkpoint, builds the run, submits it to the engine,
and turns the engine's typed outputs into the API's answers (decoding, RDKit checks, timings)."""

import functools
import logging
import time
from pathlib import Path

from ttcore.sampling import GenerationRun

from .engine import Engine, EngineError, Job, StepOutput
from .registry import ModelRegistry
from .schema import GenerateRequest, GenerateResponse, Sample, StepEvent, Timings

log = logging.getLogger("ttcore.serving")


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


class Serving:
    """The generation API over a registry of models and an engine."""

    def __init__(self, registry: ModelRegistry, engine: Engine):
        self.registry, self.engine, self.metrics = registry, engine, engine.metrics
        if any(lm.domain == "smiles" for lm in registry.models):
            smiles_checker()  # says at start-up, not at the first answer, when RDKit is missing

    def submit(self, request: GenerateRequest) -> Job:
        """Admit a request (raises ModelNotFound, PromptError, Overloaded). Must run on the event loop."""
        lm = self.registry.resolve(request.model, request.decomposition, request.rank)
        prompt = self.registry.encode_prompt(lm, request.prompt) if request.prompt else None
        run = GenerationRun(lm.model, request.num_samples, request.steps, prompt=prompt, device=self.registry.device,
                            **request.sampler_settings())
        return self.engine.submit(lm, run)

    async def events(self, job: Job):
        """(event, payload) pairs: a ``step`` per denoising step, then ``done`` (the answer) or ``error``;
        closing it early cancels the job."""
        async for out in self.engine.outputs(job):
            if isinstance(out, EngineError):
                yield "error", {"id": job.id, "error": out.message}
                return
            yield "step", self.step_event(job, out).model_dump()
            if out.finished:
                yield "done", self.answer(job, out).model_dump()

    def step_event(self, job: Job, out: StepOutput) -> StepEvent:
        tok = job.lm.tokenizer
        return StepEvent(step=out.step, sequences=[tok.decode(row) for row in out.tokens.tolist()],
                         committed=out.committed)

    def answer(self, job: Job, out: StepOutput) -> GenerateResponse:
        lm, now = job.lm, time.perf_counter()
        check = smiles_checker() if lm.domain == "smiles" else None
        samples = []
        for row in out.tokens.tolist():
            text = lm.tokenizer.decode(row)
            canonical = check(text) if check is not None else None
            samples.append(Sample(text=text, valid=None if check is None else canonical is not None,
                                  canonical=canonical))
        self.metrics.samples.labels(lm.family).inc(len(samples))
        self.metrics.steps.labels(lm.family).inc(out.step)
        self.metrics.model_calls.observe(out.model_calls)
        timings = Timings(queue_ms=1e3 * (job.started - job.arrived),
                          first_event_ms=1e3 * (job.first_output - job.arrived), total_ms=1e3 * (now - job.arrived))
        return GenerateResponse(id=job.id, model=lm.family, checkpoint=lm.name, decomposition=lm.info.decomposition,
                                rank=lm.info.rank, samples=samples, steps=out.step, model_calls=out.model_calls,
                                timings=timings)


def build_serving(checkpoints: str | Path, *, device: str = "cpu", precision: str = "auto",
                  max_batch_samples: int = 256, max_requests: int = 64, threads: int | None = None) -> Serving:
    """Load every checkpoint under ``checkpoints`` and start an engine over them."""
    engine = Engine(max_batch_samples=max_batch_samples, max_requests=max_requests, threads=threads)
    return Serving(ModelRegistry(checkpoints, device, precision), engine)
