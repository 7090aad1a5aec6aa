"""The text-completion API's serving (OpenAI's ``/v1/completions``, ``service.openai_api``): a prompt as a
template or a prefix, and each step's committed text as the streaming rule deltas it, over the shared
``Ticket`` and telemetry of ``service.serving``."""

import time
from dataclasses import dataclass

from ttcore.tokenizers.symbols import MASK  # every tokenizer spells it so: a prompt with it is a template

from .batcher import EngineError
from .schema import Telemetry
from .serving import Failure, Serving, Ticket


class CompletionText:
    """One text completion of a canvas (OpenAI's completions): which positions it covers, and what it has
    streamed so far (the streaming rule: ``service.openai_api``)."""

    def __init__(self, tok, start: int, max_tokens: int | None, min_tokens: float = 0):
        self.tok, self.start, self.max_tokens, self.min_tokens = tok, start, max_tokens, min_tokens
        self.emitted, self.finished = "", False

    def completion(self, row: list[int], final: bool) -> tuple[list[int], str | None]:
        """The completion's token ids: its committed leading run (all of it when ``final``), cut at the
        first end token at or after ``min_tokens`` tokens (earlier ones are skipped; ``inf``: OpenAI-compatible
        ``ignore_eos``) or at max_tokens. -> (ids, finish reason or None while it can still grow)."""
        tok, out = self.tok, []
        for t in row[self.start:]:
            if t == tok.mask_id and not final:
                return out, None
            if t == tok.pad_id:
                if len(out) >= self.min_tokens:
                    return out, "stop"
                continue
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
    telemetry: Telemetry | None = None


def completion_prompt(serving: Serving, lm, prompt: str) -> CompletionPrompt:
    """The prompt of a text completion (raises PromptError, as ``submit`` would)."""
    tok = lm.tokenizer
    ids = serving.registry.encode_prompt(lm, prompt).tolist() if prompt else []
    template = MASK in prompt
    start = 0 if template or not prompt else len(tok.tokenize(prompt, allow_mask=True))
    return CompletionPrompt(template, start, sum(t not in (tok.mask_id, tok.pad_id) for t in ids[:tok.length]))


async def completions(serving: Serving, job: Ticket, prompt: CompletionPrompt, n: int, max_tokens: int | None,
                      stream: bool, min_tokens: float = 0):
    """``CompletionStep``s of ``job`` (every step when ``stream``, else the last only), or a ``Failure``:
    decoding is timed into the answer's ``decode_ms`` and the finished request counted in the metrics."""
    tok = job.lm.tokenizer
    choices = [CompletionText(tok, prompt.start, max_tokens, min_tokens) for _ in range(n)]
    async for out in serving.engine.outputs(job.job):
        if isinstance(out, EngineError):
            yield Failure(job.id, out.kind, out.message)
            return
        if not (out.finished or (stream and out.sends)):
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
        telemetry = serving.answer_telemetry(job, out) if out.finished else None
        yield CompletionStep(out.step, deltas, canvases, out.committed, made, final, telemetry)
        if out.finished:
            return
