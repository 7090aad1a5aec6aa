"""Serving: a request in, answers out. Resolves the checkpoint, builds the run, submits it to the engine,
and turns the engine's typed outputs into the API's answers (decoding, RDKit checks, timings)."""

import asyncio
import functools
import logging
import time
from dataclasses import dataclass

import torch

from ttcore import scoring
from ttcore.losses import sample_times
from ttcore.sampling import GenerationRun, InvalidSampler, cost
from ttcore.sampling.steps import WorkKind
from ttcore.tokenizers.symbols import MASK  # every tokenizer spells it so: a prompt with it is a template

from . import admission
from .config import ServiceArgs
from .engine import Engine, EngineError, Job, Overloaded, StepOutput
from .registry import ModelRegistry
from .schema import (
    MAX_SEED,
    MAX_VALID_ROUNDS,
    ROUND_SEED_STRIDE,
    GenerateRequest,
    GenerateResponse,
    Sample,
    Score,
    ScoreRequest,
    ScoreResponse,
    StepEvent,
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
    """A request that ended without an answer: ``kind`` as ``EngineError.kind`` (``statuses`` maps it)."""
    id: str
    kind: str
    message: str

    def payload(self) -> dict:
        return {"id": self.id, "error": self.message, "code": self.kind}


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


class CompletionText:
    """One text completion of a canvas (OpenAI's completions): which positions it covers, and what it has
    streamed so far (the streaming rule: ``service.openai_api``)."""

    def __init__(self, tok, start: int, max_tokens: int | None):
        self.tok, self.start, self.max_tokens = tok, start, max_tokens
        self.emitted, self.finished = "", False

    def completion(self, row: list[int], final: bool) -> tuple[list[int], str | None]:
        """The completion's token ids: its committed leading run (all of it when ``final``), cut at the
        first end token or max_tokens. -> (ids, finish reason or None while it can still grow)."""
        tok, out = self.tok, []
        for t in row[self.start:]:
            if t == tok.mask_id and not final:
                return out, None
            if t == tok.pad_id:
                return out, "stop"
            if self.max_tokens is not None and len(out) == self.max_tokens:
                return out, "length"
            out.append(t)
        return out, "length"

    def delta(self, row: list[int], final: bool) -> tuple[str, str | None]:
        """New text of the contiguous committed prefix (a trailing undecodable byte waits for the next)."""
        ids, reason = self.completion(row, final)
        text = self.tok.decode(ids)
        if reason is None:
            text = text.rstrip("\ufffd")
        if not text.startswith(self.emitted):
            return "", reason  # never un-say a delta: wait until the text extends what was sent
        new, self.emitted = text[len(self.emitted):], text
        return new, reason


@dataclass(frozen=True)
class CompletionPrompt:
    """A completion request's prompt as tokens: a ``template`` (with [MASK]) is filled whole, a prefix is
    continued from position ``start``; ``tokens``: the prompt tokens given (usage)."""
    template: bool
    start: int
    tokens: int


@dataclass(frozen=True)
class CompletionStep:
    """One step of a text completion request: ``deltas`` (choice, new text of its committed prefix, finish
    reason or None) for the choices still open, each choice's canvas (``[MASK]`` where masked) and committed
    positions; on the last step ``final`` (each choice's whole text and finish reason), and ``telemetry``."""
    step: int
    deltas: list
    canvases: list
    committed: list
    completion_tokens: int = 0
    final: list | None = None
    telemetry: dict | None = None


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
        for lm in registry.models:
            lm.metrics.checker()  # says at start-up, not at the first answer, when a check's dependency is missing

    async def admit(self, request: GenerateRequest) -> Ticket:
        """``submit`` for a client's request: a compute refusal (``admission.TooLarge``) of a kind of work that no
        request has measured yet first re-times that kind on its model's idle worker and decides again
        (``Speed.recalibrate``), so that a timing inflated by a busy machine does not go on
        refusing requests the machine now serves. A kind of work no request has needed yet is timed first, on
        the model's worker (``Speed.ensure``). Must run on the event loop."""
        lm = self.registry.resolve(request.model, request.decomposition, request.rank)
        try:
            kind = request.to_sampler_config().work_kind(lm.model.cfg)
        except InvalidSampler:
            kind = None  # submit refuses it
        if kind is not None and lm.speed.needs(kind):
            await self.engine.run_on_worker(lm, lambda: lm.speed.ensure(lm.model, kind))
        try:
            return self.submit(request)
        except admission.TooLarge as e:
            if not (e.compute and self.engine.idle(lm) and lm.speed.may_recalibrate(kind)):
                self.metrics.too_large.labels(lm.family, e.field).inc()
                raise
        before = lm.speed.estimate(kind)
        await self.engine.run_on_worker(lm, lambda: lm.speed.recalibrate(lm.model, kind))
        log.info("re-timed %s's %s before refusing a request: %.4g s a sequence, %.4g s at start-up", lm.name, kind,
                 lm.speed.estimate(kind), before)
        try:
            return self.submit(request)
        except admission.TooLarge as e:
            self.metrics.too_large.labels(lm.family, e.field).inc()
            raise

    def submit(self, request: GenerateRequest) -> Ticket:
        """Admit a request (raises ModelNotFound, PromptError, Unsupported, admission.TooLarge, Overloaded). Must run on
        the event loop."""
        lm = self.registry.resolve(request.model, request.decomposition, request.rank)
        prompt = self.registry.encode_prompt(lm, request.prompt) if request.prompt else None
        timeout = min(request.timeout_s or self.max_timeout_s, self.max_timeout_s)
        if request.valid_only and not lm.metrics.validates:
            raise Unsupported("valid_only", f"valid_only needs a family whose metrics check samples (molecules); "
                                            f"{lm.name}'s family {lm.family} is measured by {lm.info.metrics}")
        try:
            config = request.to_sampler_config()
        except InvalidSampler as e:  # settings no step class runs together (the schema checked each alone)
            raise Unsupported(e.field, str(e)) from None
        if request.stream:
            admission.check_stream(request.num_samples, request.steps, lm.model.cfg.dit.length, request.step_tokens,
                                   MAX_VALID_ROUNDS if request.valid_only else 1, self.max_stream_bytes)
        lm.speed.ensure(lm.model, config.work_kind(lm.model.cfg))  # ``admit`` timed it on the worker already
        plan = admission.plan(lm.model, lm.speed, num_samples=request.num_samples, steps=request.steps,
                              config=config, timeout_s=timeout, memory_budget=self.memory_budget,
                              step_limit_s=self.max_step_s)
        run = GenerationRun(lm.model, request.num_samples, request.steps, config, seed=request.seed, prompt=prompt,
                            device=self.registry.device, max_rows_per_pass=plan.max_rows_per_pass)
        return Ticket(self.engine.submit(lm, run, plan.seconds, timeout, kind=config.work_kind(lm.model.cfg)))

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
                if steps:
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
                job.next_round = job = self.submit(request.model_copy(update={"seed": seed, "timeout_s": left}))
            except admission.TooLarge:  # what is left of the deadline cannot fit a round
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

    async def score(self, request: ScoreRequest, gone=None) -> ScoreResponse:
        """Exact joint scores or the ELBO of ``request.sequences`` (raises ModelNotFound, ScoreInputError,
        admission.TooLarge, ScoreTimeout, ScoreCancelled). Admitted by its estimated compute against its
        deadline, then run on the model's worker one piece at a time (a micro-batch, or one ELBO draw of
        one), so generation steps interleave with it and no piece holds the worker long; between pieces
        the deadline is checked and ``await gone()`` (the client left) cancels it."""
        arrived = time.perf_counter()
        lm = self.registry.resolve(request.model, request.decomposition, request.rank)
        model, tok = lm.model, lm.tokenizer
        if model.latent_dim:
            raise ScoreInputError(["model"], f"{lm.name} is a VADD model: its likelihood integrates over the "
                                             "latent z, which has no exact form; scores need an MDLM checkpoint")
        if request.mode == "elbo" and request.template is not None:
            raise ScoreInputError(["template"], "template applies to joint mode only: elbo draws its own masks")
        x0, mask, lengths = _encode_for_scoring(tok, request)
        rows = cost.rows_per_pass(model.cfg, True, self.memory_budget)
        if rows == 0:
            raise ScoreInputError(["model"], "one sequence of this model does not fit the server's memory budget")
        timeout = min(request.timeout_s or self.max_timeout_s, self.max_timeout_s)
        draws = request.num_mc if request.mode == "elbo" else 1
        # scoring computes every masked position's exact marginals: what an exact step costs, where a format has one
        exact = "exact" in model.cfg.format.contractions
        kind = WorkKind.exact_step if exact else WorkKind.predetermined_step

        def check():
            admission.check_passes(len(x0), draws, rows, lambda n: lm.speed.step_seconds(kind, n), timeout,
                                   self.max_step_s, request.mode)
        if lm.speed.needs(kind):
            await self.engine.run_on_worker(lm, lambda: lm.speed.ensure(model, kind))
        try:
            try:
                check()
            except admission.TooLarge:  # as ``admit``: an unmeasured kind is re-timed once before a refusal
                if not (self.engine.idle(lm) and lm.speed.may_recalibrate(kind)):
                    raise
                await self.engine.run_on_worker(lm, lambda: lm.speed.recalibrate(model, kind))
                check()
        except admission.TooLarge as e:
            self.metrics.too_large.labels(lm.family, e.field).inc()
            raise
        generator = torch.Generator().manual_seed(request.seed if request.seed is not None else
                                                  int(torch.randint(0, 2**62, (1,))))
        device = self.registry.device
        real = torch.arange(tok.length)[None] < torch.tensor(lengths)[:, None]  # the tokens before padding
        times = sample_times(draws, 1e-3, torch.device("cpu"), generator) if request.mode == "elbo" else None

        def piece(s: int, t):
            x, m = x0[s:s + rows].to(device), mask[s:s + rows].to(device)
            with model.compute_context():
                if t is None:
                    return scoring.score(model, x, m)
                return scoring.elbo_draw(model, x, t.to(device), real[s:s + rows].to(device), tok.pads,
                                         generator).cpu()

        out = []
        for s in range(0, len(x0), rows):
            values = []
            for t in ([None] if times is None else times):
                if time.perf_counter() - arrived > timeout:
                    raise ScoreTimeout(f"the request's deadline of {timeout:g} s passed")
                if gone is not None and await gone():
                    raise ScoreCancelled("the client went away")
                values.append(await self.engine.run_on_worker(lm, functools.partial(piece, s, t)))
            n = len(x0[s:s + rows])
            if times is None:
                log_prob, token = values[0]
                out += [Score(tokens=tok.length, real_tokens=k, log_prob=lp,
                              token_log_probs=[None if v != v else v for v in tl])
                        for lp, tl, k in zip(log_prob.tolist(), token.tolist(), lengths[s:s + n])]
            else:
                mean, stderr = scoring.elbo_summary(torch.stack(values))
                terms = "all" if tok.pads else "real"
                out += [Score(tokens=tok.length, real_tokens=k, nelbo_per_token=mu, nelbo_terms=terms,
                              stderr=None if se != se else se)
                        for mu, se, k in zip(mean.tolist(), stderr.tolist(), lengths[s:s + n])]
        return ScoreResponse(model=lm.family, checkpoint=lm.name, decomposition=lm.info.decomposition,
                             rank=lm.info.rank, mode=request.mode, scores=out)

    def completion_prompt(self, lm, prompt: str) -> CompletionPrompt:
        """The prompt of a text completion (raises PromptError, as ``submit`` would)."""
        tok = lm.tokenizer
        ids = self.registry.encode_prompt(lm, prompt).tolist() if prompt else []
        template = MASK in prompt
        start = 0 if template or not prompt else len(tok.tokenize(prompt, allow_mask=True))
        return CompletionPrompt(template, start, sum(t not in (tok.mask_id, tok.pad_id) for t in ids[:tok.length]))

    async def completions(self, job: Ticket, prompt: CompletionPrompt, n: int, max_tokens: int | None,
                          stream: bool):
        """``CompletionStep``s of ``job`` (every step when ``stream``, else the last only), or a ``Failure``:
        decoding is timed into the answer's ``decode_ms`` and the finished request counted in the metrics."""
        tok = job.lm.tokenizer
        choices = [CompletionText(tok, prompt.start, max_tokens) for _ in range(n)]
        async for out in self.engine.outputs(job.job):
            if isinstance(out, EngineError):
                yield Failure(job.id, out.kind, out.message)
                return
            if not (stream or out.finished):
                continue
            rows, t0 = out.tokens.tolist(), time.perf_counter()
            deltas, canvases = [], []
            if stream:
                canvases = [tok.decode(row) for row in rows]
                for i, (c, row) in enumerate(zip(choices, rows)):
                    if not c.finished:
                        text, reason = c.delta(row, out.finished)
                        c.finished = reason is not None
                        deltas.append((i, text, reason))
            final, made = None, 0
            if out.finished:
                final = []
                for c, row in zip(choices, rows):
                    ids, reason = c.completion(row, True)
                    final.append((tok.decode(ids), reason))
                    made += len(ids)
            job.decode_s += time.perf_counter() - t0
            telemetry = self.answer_telemetry(job, out) if out.finished else None
            yield CompletionStep(out.step, deltas, canvases, out.committed, made, final, telemetry)
            if out.finished:
                return

    def answer_telemetry(self, ticket: Ticket, out: StepOutput) -> dict:
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
        return {"steps": out.step, "model_calls": out.model_calls, "checkpoint": job.lm.name,
                "tokens_per_step": job.tokens_per_step, "timings": timings.model_dump()}

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
                                tokens_per_step=telemetry["tokens_per_step"], drawn=len(samples),
                                timings=telemetry["timings"])


class Unsupported(ValueError):
    """The model or sampler cannot do what the request asks, at any size; ``field`` names the setting."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class ScoreTimeout(TimeoutError):
    """A /score request's deadline passed between its pieces."""


class ScoreCancelled(Exception):
    """A /score request's client went away."""


class ScoreInputError(ValueError):
    """A sequence or the template cannot be scored; ``loc`` names it (e.g. ``["sequences", 3]``)."""

    def __init__(self, loc: list, message: str):
        super().__init__(message)
        self.loc = loc


def _encode_for_scoring(tok, request: ScoreRequest) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """-> (tokens [b, l], mask [b, l], real tokens per sequence); raises ScoreInputError naming the
    sequence. With a template, its [MASK] positions are masked and every other position (after its end
    too) keeps the sequence's token."""
    rows, lengths = [], []
    for i, text in enumerate(request.sequences):
        try:
            ids = tok.tokenize(text)
        except ValueError as e:
            raise ScoreInputError(["sequences", i], str(e)) from None
        if len(ids) > tok.length:
            raise ScoreInputError(["sequences", i], f"{len(ids)} tokens, more than the model length {tok.length}")
        rows.append(ids + [tok.pad_id] * (tok.length - len(ids)))
        lengths.append(len(ids))
    x0 = torch.tensor(rows, dtype=torch.long)
    mask = torch.ones_like(x0, dtype=torch.bool)
    if request.template:
        try:
            ids = tok.tokenize(request.template, allow_mask=True)
        except ValueError as e:
            raise ScoreInputError(["template"], str(e)) from None
        if len(ids) > tok.length:
            raise ScoreInputError(["template"], f"{len(ids)} tokens, more than the model length {tok.length}")
        given = torch.tensor([t != tok.mask_id for t in ids] + [False] * (tok.length - len(ids)))
        fixed = torch.tensor(ids + [tok.mask_id] * (tok.length - len(ids)))
        for i in range(len(rows)):
            bad = (given & (x0[i] != fixed)).nonzero()
            if len(bad):
                raise ScoreInputError(["sequences", i], f"does not match the template at position {int(bad[0])}")
        masked = torch.tensor([t == tok.mask_id for t in ids] + [False] * (tok.length - len(ids)))
        mask = masked.expand_as(x0).clone()
    return x0, mask, lengths


def build_serving(args: ServiceArgs) -> Serving:
    """Load every checkpoint under ``args.checkpoints`` and start an engine over them."""
    return Serving(ModelRegistry(args.checkpoints, args.device, args.precision), Engine(args), args)
