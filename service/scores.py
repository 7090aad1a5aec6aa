"""The scoring API's serving (``POST /score``): exact joint scores or the ELBO of given sequences, run on the
model's worker one piece at a time under the engine's request limit (``Engine.reserve``)."""

import functools
import time

import torch

from ttcore import scoring
from ttcore.losses import sample_times
from ttcore.sampling import cost
from ttcore.sampling.steps import WorkKind

from . import admission
from .engine import DRAIN_RETRY_AFTER_S, SHUTDOWN_MESSAGE
from .refusals import Overloaded, ScoreCancelled, ScoreInputError, ScoreTimeout, TooLarge
from .score_schema import Score, ScoreRequest, ScoreResponse
from .serving import Serving


async def score(serving: Serving, request: ScoreRequest, gone=None) -> ScoreResponse:
    """Exact joint scores or the ELBO of ``request.sequences`` (raises ModelNotFound, ScoreInputError,
    TooLarge, Overloaded, ScoreTimeout, ScoreCancelled). Admitted by its estimated compute against its
    deadline and by the engine's request limit (``Engine.reserve``: it holds one of the slots generation
    requests hold), then run on the model's worker one piece at a time (a micro-batch, or one ELBO draw of
    one), so generation steps interleave with it and no piece holds the worker long."""
    arrived = time.perf_counter()
    lm = serving.registry.resolve(request.model, request.decomposition, request.rank, request.checkpoint)
    model, tok = lm.model, lm.tokenizer
    if not lm.kind.elbo and request.mode == "elbo":
        raise ScoreInputError(["mode"], f"{lm.name} is {lm.kind.description}: its log p(x) is exact (mode joint); "
                                        "the ELBO is a masked diffusion model's bound")
    if model.latent_dim:
        raise ScoreInputError(["model"], f"{lm.name} is a {lm.info.base} model: its likelihood integrates over the "
                                         "latent z, which has no exact form; scores need an MDLM checkpoint")
    if request.mode == "elbo" and request.template is not None:
        raise ScoreInputError(["template"], "template applies to joint mode only: elbo draws its own masks")
    x0, mask, lengths = _encode_for_scoring(tok, request)
    why = lm.kind.score_refusal(model.cfg, mask)
    if why is not None:
        raise ScoreInputError(["template"], f"{lm.name}: {why} (the positions after a "
                                            "template are known)")
    width = lm.kind.score_width  # a pass over score_width x the length a sequence: counted as that many rows
    rows = cost.rows_per_pass(model.cfg, True, serving.memory_budget) // width
    if rows == 0:
        raise ScoreInputError(["model"], "one sequence of this model does not fit the server's memory budget")
    timeout = min(request.timeout_s or serving.max_timeout_s, serving.max_timeout_s)
    draws = request.num_mc if request.mode == "elbo" else 1
    # scoring computes every masked position's exact marginals: what an exact step costs, where a format has one
    kind = WorkKind.exact_step if "exact" in model.cfg.format.contractions else WorkKind.predetermined_step

    def check() -> float:
        return admission.check_passes(len(x0), draws, rows, lambda n: lm.speed.step_seconds(kind, width * n), timeout,
                                      serving.max_step_s, request.mode)
    if lm.speed.needs(kind):
        await serving.engine.run_on_worker(lm, lambda: lm.speed.ensure(model, kind), calibration=True)
    try:
        estimate = check()
    except TooLarge as e:  # as ``Serving.admit``: an unmeasured kind is re-timed afterwards, in the background
        serving.metrics.too_large.labels(lm.family, e.field).inc()
        if lm.speed.may_recalibrate(kind):
            serving.retime(lm, kind)
        raise
    job = serving.engine.reserve(lm, estimate, timeout)  # one of the request slots: Overloaded when none is free
    try:
        scores = await _run(serving, request, lm, job, (x0, mask, lengths), rows, draws,
                            lambda: time.perf_counter() - arrived > timeout, gone)
    finally:
        serving.engine.release(job)
    return ScoreResponse(model=lm.family, checkpoint=lm.name, decomposition=lm.info.decomposition,
                         rank=lm.info.rank, mode=request.mode, scores=scores)


async def _run(serving: Serving, request: ScoreRequest, lm, job, encoded, rows: int, draws: int, late,
               gone) -> list[Score]:
    """The admitted request's pieces on the model's worker; between pieces its deadline (``late()``), its client
    (``await gone()``) and an abort of its job are checked."""
    model, tok = lm.model, lm.tokenizer
    x0, mask, lengths = encoded
    generator = torch.Generator().manual_seed(request.seed if request.seed is not None else
                                              int(torch.randint(0, 2**62, (1,))))
    device = serving.registry.device
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
            if late():
                raise ScoreTimeout(f"the request's deadline of {job.timeout_s:g} s passed")
            if job.shutdown:
                raise Overloaded(SHUTDOWN_MESSAGE, DRAIN_RETRY_AFTER_S)
            if job.cancelled:
                raise ScoreCancelled("the request was cancelled")
            if gone is not None and await gone():
                job.cancelled = True  # counted as cancelled when its slot is released (ttcore_cancelled_total)
                raise ScoreCancelled("the client went away")
            values.append(await serving.engine.run_on_worker(lm, functools.partial(piece, s, t)))
            serving.metrics.score_pieces.labels(lm.family).inc()
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
    return out


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
