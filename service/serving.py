"""Serving: a request in, answers out. Resolves the checkpoint, builds the run, submits it to the engine,
and turns the engine's typed outputs into the API's answers (decoding, RDKit checks, timings)."""

import asyncio
import functools
import logging
import time
from dataclasses import dataclass

import torch

from ttcore.constraints import ConstraintError
from ttcore.sampling import GenerationRun, InvalidSampler, cost

from . import admission
from .batcher import EngineError, Job, StepOutput
from .config import ServiceArgs
from .constraints import AutomatonCache
from .engine import Engine
from .refusals import Overloaded, TooLarge, Unsupported
from .registry import ModelRegistry
from .schema import (
    MAX_SEED,
    MAX_VALID_ROUNDS,
    ROUND_SEED_STRIDE,
    GenerateRequest,
    GenerateResponse,
    Sample,
    StepEvent,
    Telemetry,
    Timings,
)

log = logging.getLogger("ttcore.serving")


@functools.lru_cache(maxsize=4096)
def depict(smiles: str, width: int, height: int) -> str | None:
    """An SVG drawing of a valid SMILES (RDKit; cached), else None. Raises ImportError without RDKit."""
    from ttcore.metrics.molecules import depiction_svg
    return depiction_svg(smiles, width, height)


DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks that its client is still there


@dataclass(frozen=True)
class Failure:
    """A request that ended without an answer: ``kind`` as ``EngineError.kind`` (``failure_status`` maps it)."""
    id: str
    kind: str
    message: str

    def payload(self) -> dict:
        return {"id": self.id, "error": self.message, "code": self.kind}


@dataclass(frozen=True)
class Prepared:
    """A request checked against its checkpoint (``Serving.prepare``): the request with the checkpoint's
    defaults, its prompt's tokens (None: no prompt), sampler settings, automaton (its cache key, the field that
    asked for it) and kind of work."""
    request: GenerateRequest
    lm: object
    prompt: torch.Tensor | None
    config: object
    key: tuple | None
    constraint: object
    field: str
    work: object


@dataclass
class Ticket:
    """A request as serving tracks it: its engine job, the time the front end spent decoding its outputs, and
    the further round a ``valid_only`` request started (so that ``abort`` reaches it). The engine's ``Job``
    knows none of these."""
    job: Job
    decode_s: float = 0.0
    next_round: "Ticket | None" = None

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def lm(self):
        return self.job.lm


class Serving:
    """The generation API over a registry of models and an engine. ``memory_budget_mb``: the most one step
    of one request may hold (larger requests are micro-batched); ``max_timeout_s``: the longest deadline
    (a request's ``timeout_s`` may only shorten it)."""

    def __init__(self, registry: ModelRegistry, engine: Engine, args: ServiceArgs | None = None):
        args = args or ServiceArgs()
        self.registry, self.engine, self.metrics = registry, engine, engine.metrics
        self.memory_budget, self.max_timeout_s = args.memory_budget_mb << 20, args.max_timeout_s
        self.max_step_s = engine.stall_s / 2 if args.max_step_s is None else args.max_step_s
        self.max_stream_bytes = int(args.max_stream_mb * 2**20)
        self._background: set[asyncio.Task] = set()  # re-timings after refusals (``retime``)
        self.automata = AutomatonCache(int(args.max_automata_mb * 2**20))  # admitted requests' automata
        for lm in registry.models:
            lm.metrics.checker()  # says at start-up, not at the first answer, when a check's dependency is missing

    async def admit(self, request: GenerateRequest) -> Ticket:
        """``submit`` for a client's request, with everything that can take more than a few milliseconds off the
        event loop: the request is checked against its checkpoint on a thread (``prepare``: its automaton built,
        bounded, or found among the admitted ones, and its satisfiability decided there). A kind of work no
        request has needed yet is timed first, on the model's worker (``Speed.ensure``: a second at most). A
        compute refusal (``TooLarge``) of a kind that no request has measured yet re-times that kind afterwards,
        in the background (``Speed.recalibrate``), so that a timing inflated by a busy machine does not go on
        refusing requests the machine now serves, and no client waits for it. Must run on the event loop."""
        prepared = await asyncio.to_thread(self.prepare, request)
        lm, kind = prepared.lm, prepared.work.kind
        if lm.speed.needs(kind):
            await self.engine.run_on_worker(lm, lambda: lm.speed.ensure(lm.model, kind), calibration=True)
        try:
            return self.submit(prepared)
        except TooLarge as e:
            self.metrics.too_large.labels(lm.family, e.field).inc()
            if e.compute and lm.speed.may_recalibrate(kind):
                self.retime(lm, kind)
            raise

    def resolve(self, request: GenerateRequest):
        """The checkpoint that answers ``request`` (``ModelRegistry.resolve``; the steps it asks, when set,
        choose among equally expressive checkpoints)."""
        steps = request.steps if "steps" in request.model_fields_set else None
        return self.registry.resolve(request.model, request.decomposition, request.rank, request.checkpoint, steps)

    @staticmethod
    def with_defaults(request: GenerateRequest, lm) -> GenerateRequest:
        """``request`` with the checkpoint's defaults for what it leaves unset: a distilled checkpoint's steps; an
        the settings its kind fixes (an autoregressive checkpoint's steps, its length, and ordering, left to right)."""
        update = {}
        if "steps" not in request.model_fields_set and lm.info.default_steps is not None:
            update["steps"] = lm.info.default_steps
        for name, value in lm.kind.request_defaults(lm.model.cfg).items():
            if name not in request.model_fields_set:
                update[name] = value
        return request.model_copy(update=update) if update else request

    def retime(self, lm, kind) -> None:
        """Re-time ``kind`` of ``lm`` on its worker in the background (``Speed.recalibrate``)."""
        lm.speed.mark_recalibrating(kind)  # a second refusal meanwhile does not start another

        async def retime():
            before = lm.speed.estimate(kind)
            await self.engine.run_on_worker(lm, lambda: lm.speed.recalibrate(lm.model, kind), calibration=True)
            log.info("re-timed %s's %s after a refusal: %.4g s a sequence, %.4g s before", lm.name, kind,
                     lm.speed.estimate(kind), before)
        task = asyncio.get_running_loop().create_task(retime())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def prepare(self, request: GenerateRequest) -> "Prepared":
        """The request checked against its checkpoint, once (raises ModelNotFound, PromptError, Unsupported):
        defaults, prompt tokens, sampler settings, the constraint and the kind of work. Safe
        on a thread (``admit`` runs it so); on the event loop only for what admission has seen (a further
        ``valid_only`` round: its automaton kept)."""
        lm = self.resolve(request)
        request = self.with_defaults(request, lm)
        prompt = self.registry.encode_prompt(lm, request.prompt) if request.prompt else None
        if request.valid_only and not lm.metrics.validates:
            raise Unsupported("valid_only", f"valid_only needs a family whose metrics check samples (molecules); "
                                            f"{lm.name}'s family {lm.family} is measured by {lm.info.metrics}")
        try:
            config = request.to_sampler_config()
        except InvalidSampler as e:  # settings no step class runs together (the schema checked each alone)
            raise Unsupported(e.field, str(e)) from None
        key, constraint, field = self.constraint(lm, request, config, prompt)
        return Prepared(request, lm, prompt, config, key, constraint, field,
                        cost.work_of(lm.model.cfg, config, request.steps, constraint))

    def constraint(self, lm, request, config, prompt=None):
        """The request's automaton (``service.constraints``; None: unconstrained): -> (its cache key, it, the
        field that asked for it). Raises Unsupported: a bad or empty language, one no sequence of the model's
        length (agreeing with the prompt) is in, or settings that cannot draw within it (``joint: false``; the
        exact chain rule, which re-runs the automaton's messages every pick: ``adaptive_path: fast`` draws the
        same constrained joint). Seconds for a new regex over a text vocabulary (``prepare`` runs on a thread)."""
        field = "grammar" if request.grammar is not None else "regex"
        key = lm.constraints.key(request.regex, request.grammar, request.prompt)
        if key is None:
            return None, None, field
        if not lm.kind.constrains:
            raise Unsupported(field, f"{field} is served by the masked diffusion checkpoints ({lm.kind.description} "
                                     "draws no joint of the masked positions to restrict)")
        if not lm.model.format.chains:  # the format says whether its joint is a chain an automaton can restrict
            raise Unsupported(field, f"{field}: the {lm.model.format.name} format's joint is not a chain (its "
                                     "joint has no chain(), what a constrained draw multiplies with the automaton)")
        if not config.joint:
            raise Unsupported("joint", f"{field} needs the joint draw: joint false draws each position alone")
        if config.step.adaptive:
            raise Unsupported("adaptive_path", f"{field} is served with adaptive_path fast (the exact chain rule "
                                               "re-runs the automaton at every pick)")
        if not config.step.constrains:  # the step class says whether it draws within a language
            raise Unsupported(field, f"{field}: sampler {config.sampler} draws no joint of the masked positions to "
                                     "restrict")
        constraint = self.automata.get(key) or lm.constraints.build(key)
        length = lm.model.cfg.dit.length
        if not constraint.fits(length):
            raise Unsupported(field, f"{field}: no sequence of this model's {length} tokens is in the language")
        if prompt is not None:  # decided here, kept with the automaton: the run's own check finds it
            template = torch.where(prompt == lm.tokenizer.mask_id, -1, prompt)
            if not constraint.admits(template):
                raise Unsupported("prompt", f"{field}: no sequence of the model's length that agrees with the "
                                            "prompt is in the language")
        return key, constraint, field

    @staticmethod
    def stop_token(lm, constraint) -> int | None:
        """Where a sequence ends: the tokenizer's end (``Tokenizer.end_id``: text's end-of-text) on a kind that
        stops there (block diffusion: the blocks after the one that drew it are not drawn, as BD3-LM samples
        variable-length text), unconstrained; else None."""
        end = lm.tokenizer.end_id
        return end if end is not None and lm.model.cfg.kind.stops and constraint is None else None

    def submit(self, prepared: "Prepared | GenerateRequest") -> Ticket:
        """Admit a request (raises ModelNotFound, PromptError, Unsupported, TooLarge, Overloaded). Must run on
        the event loop; a ``GenerateRequest`` is prepared here (``prepare``): give ``admit`` a client's."""
        if isinstance(prepared, GenerateRequest):
            prepared = self.prepare(prepared)
        request, lm, config, constraint = prepared.request, prepared.lm, prepared.config, prepared.constraint
        timeout = min(request.timeout_s or self.max_timeout_s, self.max_timeout_s)
        if request.stream:
            admission.check_stream(request.num_samples, request.steps, lm.model.cfg.dit.length, request.step_tokens,
                                   MAX_VALID_ROUNDS if request.valid_only else 1, self.max_stream_bytes)
        lm.speed.ensure(lm.model, prepared.work.kind)  # ``admit`` timed it on the worker already
        plan = admission.plan(lm.model, lm.speed, num_samples=request.num_samples, steps=request.steps,
                              config=config, timeout_s=timeout, memory_budget=self.memory_budget,
                              step_limit_s=self.max_step_s, constraint=constraint, constraint_field=prepared.field)
        try:
            run = GenerationRun(lm.model, request.num_samples, request.steps, config, seed=request.seed,
                                prompt=prepared.prompt, device=self.registry.device,
                                max_rows_per_pass=plan.max_rows_per_pass, constraint=constraint,
                                stop_token=self.stop_token(lm, constraint))
        except ConstraintError as e:  # no accepted sequence agrees with the prompt
            field = "prompt" if request.prompt else prepared.field
            raise Unsupported(field, f"{prepared.field}: {e}") from None
        except InvalidSampler as e:  # what the model cannot run (an AR checkpoint's order, edlm without a pair)
            raise Unsupported(e.field, str(e)) from None
        ticket = Ticket(self.engine.submit(lm, run, plan.seconds, timeout, work=prepared.work))
        if constraint is not None:  # kept only once a request that uses it is admitted
            self.automata.put(prepared.key, constraint)
            self.metrics.automata_bytes.set(self.automata.bytes)
            self.metrics.automata.set(len(self.automata))
        return ticket

    async def events(self, job: Ticket, steps: bool = True, request: GenerateRequest | None = None):
        """Typed events: a ``StepEvent`` per denoising step (decoded only when ``steps``: a non-streaming
        answer does not pay for decoding partial sequences), then the ``GenerateResponse`` or a ``Failure``;
        closing it early cancels the job. With ``request`` its chemist's options apply to the answer:
        ``unique`` drops duplicates, ``valid_only`` draws further rounds (each admitted like a new request,
        linked from ``job.next_round`` so that ``abort`` reaches it) until enough molecules are valid; when
        the deadline passes in a further round (or what is left of it cannot fit one, or the server is too
        busy to admit one), the answer holds what the finished rounds found (``stopped_early`` says why),
        and only a request with no finished round gets the timeout error."""
        first, rounds, kept, seen = job, [], [], set()
        stopped_early = None
        while True:
            done_before = len(rounds)
            async for out in self.engine.outputs(job.job):
                if isinstance(out, EngineError):
                    if out.kind == "timeout" and rounds:
                        stopped_early = "deadline"
                        break
                    yield Failure(first.id, out.kind, out.message)
                    return
                if steps and out.sends:
                    yield self.step_event(job, out, first.id, len(rounds), request is not None and request.step_tokens)
                if out.finished:  # RDKit costs about 0.5 ms a molecule: off the event loop, so that a
                    # 256-molecule answer does not hold up every other stream
                    rounds.append(await asyncio.to_thread(self.answer, job, out))
            if stopped_early:
                break
            if len(rounds) == done_before:  # the outputs ended without an answer
                return
            for sample in rounds[-1].samples:
                key = sample.canonical or sample.text
                dropped = request is not None and ((request.valid_only and not sample.valid)
                                                   or (request.unique and key in seen))
                if not dropped:
                    seen.add(key)
                    kept.append(sample)
            if request is None or not request.valid_only or len(kept) >= request.num_samples \
                    or len(rounds) >= MAX_VALID_ROUNDS:
                break
            seed = None if request.seed is None else (request.seed + len(rounds) * ROUND_SEED_STRIDE) % (MAX_SEED + 1)
            left = first.job.timeout_s - (time.perf_counter() - first.job.arrived)  # the request's deadline holds
            if left <= 0:
                stopped_early = "deadline"
                break
            try:
                again = await asyncio.to_thread(self.prepare, request.model_copy(update={"seed": seed,
                                                                                          "timeout_s": left}))
                job.next_round = job = self.submit(again)
            except TooLarge:  # what is left of the deadline cannot fit a round
                stopped_early = "deadline"
                break
            except Overloaded:  # the server is busy: answer with what the rounds found
                stopped_early = "busy"
                break
        last = rounds[-1]
        yield last.model_copy(update={
            "id": first.id, "samples": kept[:request.num_samples] if request is not None else kept,
            "steps": sum(r.steps for r in rounds), "model_calls": sum(r.model_calls for r in rounds),
            "tokens_per_step": [n for r in rounds for n in r.tokens_per_step],
            "drawn": sum(r.drawn for r in rounds), "rounds": len(rounds),
            "stopped_early": stopped_early})

    async def cancel_when(self, gone, job: Ticket, poll_s: float = DISCONNECT_POLL_S) -> None:
        """Cancel ``job`` (and its further rounds) as soon as ``await gone()`` says its client went away;
        run as a task beside a non-streaming answer, cancelled when the answer is sent."""
        while not await gone():
            await asyncio.sleep(poll_s)
        self.abort(job)

    def abort(self, ticket: Ticket) -> None:
        """Cancel a request: its job, and the job of any further round it has started."""
        while ticket is not None:
            self.engine.abort(ticket.id)
            ticket = ticket.next_round

    def answer_telemetry(self, ticket: Ticket, out: StepOutput) -> Telemetry:
        """Steps, model calls, tokens per step and timings of a finished job (counted in the metrics once)."""
        job = ticket.job
        m, family = self.metrics, job.lm.family
        m.samples.labels(family).inc(out.tokens.shape[0])
        m.steps.labels(family).inc(out.step)
        m.model_calls.observe(out.model_calls)
        timings = self._timings(ticket)
        for phase in ("queue", "forward", "sampling", "decode"):
            m.request_seconds.labels(family, phase).observe(getattr(timings, f"{phase}_ms") / 1e3)
        for n in job.tokens_per_step:
            m.tokens_per_step.labels(family).observe(n)
        return Telemetry(checkpoint=job.lm.name, steps=out.step, model_calls=out.model_calls,
                         tokens_per_step=job.tokens_per_step, timings=timings)

    def _timings(self, ticket: Ticket) -> Timings:
        job = ticket.job
        now = time.perf_counter()
        return Timings(queue_ms=1e3 * (job.started - job.arrived),
                       first_event_ms=1e3 * (job.first_output - job.arrived), total_ms=1e3 * (now - job.arrived),
                       forward_ms=1e3 * job.forward_s, sampling_ms=1e3 * job.sampling_s,
                       decode_ms=1e3 * ticket.decode_s)

    def step_event(self, job: Ticket, out: StepOutput, request_id: str | None = None, round: int = 0,
                   tokens: bool = False) -> StepEvent:
        tok, t0 = job.lm.tokenizer, time.perf_counter()
        rows = out.tokens.tolist()
        sequences = [tok.decode(row) for row in rows]
        pieces = [tok.pieces(row) for row in rows] if tokens else None
        job.decode_s += time.perf_counter() - t0
        return StepEvent(id=request_id or job.id, round=round, step=out.step, sequences=sequences,
                         committed=out.committed, tokens=pieces)

    def answer(self, job: Ticket, out: StepOutput) -> GenerateResponse:
        lm, t0 = job.lm, time.perf_counter()
        check = lm.metrics.checker()
        samples = []
        for row in out.tokens.tolist():
            text = lm.tokenizer.decode(row)
            described = check(text) if check is not None else None
            samples.append(Sample(text=text, valid=None if check is None else described is not None,
                                  **(described or {})))
        job.decode_s += time.perf_counter() - t0
        telemetry = self.answer_telemetry(job, out)
        return GenerateResponse(id=job.id, model=lm.family, checkpoint=lm.name, decomposition=lm.info.decomposition,
                                rank=lm.info.rank, samples=samples, steps=out.step, model_calls=out.model_calls,
                                tokens_per_step=telemetry.tokens_per_step, drawn=len(samples),
                                timings=telemetry.timings)


def build_serving(args: ServiceArgs) -> Serving:
    """Load every checkpoint under ``args.checkpoints`` and start an engine over them."""
    return Serving(ModelRegistry(args.checkpoints, args.device, args.precision), Engine(args), args)
