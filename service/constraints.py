"""A request's constraint (``regex`` or ``grammar``) as the automaton its run draws within
(``ttcore.constraints``). ``Constraints`` (one a checkpoint) names a request's automaton (``key``) and builds it
(``build``: bounded, off the event loop); ``AutomatonCache`` (one a server) keeps the automata of admitted
requests only, least recently used dropped past a byte limit, so refused requests cannot fill memory. A prefix
prompt (no [MASK]) is followed by text matching the regex: the automaton reads the prompt's tokens first; a
template's whole text (and no prompt's) must match it."""

import threading
from collections import OrderedDict

from ttcore.constraints import GRAMMARS, ConstraintError, grammars_for, regex_dfa
from ttcore.tokenizers.symbols import MASK

from .refusals import Overloaded, Unsupported

BUILDS = threading.BoundedSemaphore(2)  # automata built at once, server-wide: a regex's is a child process of up
# to 3 s of CPU time and 1 GB (``ttcore.constraints.regex``), so many strangers' patterns cannot exhaust the machine
BUILD_WAIT_S = 5.0  # a request whose build cannot start within this is refused 503 (Retry-After)


def grammars_of(tokenizer) -> tuple[str, ...]:
    """The grammars a checkpoint with this tokenizer offers (``GET /models``; ``ttcore.constraints.GRAMMARS``)."""
    return grammars_for(tokenizer.kind)


class AutomatonCache:
    """The automata admitted requests used, by key (``Constraints.key``), at most ``max_bytes`` in all
    (``TokenDFA.nbytes``; the least recently used dropped first). Thread-safe: admission looks up on a thread."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._kept: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key):
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        return None

    def put(self, key, dfa) -> None:
        if dfa.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return
            self._kept[key] = dfa
            self.bytes += dfa.nbytes
            while self.bytes > self.max_bytes:
                _, dropped = self._kept.popitem(last=False)
                self.bytes -= dropped.nbytes


class Constraints:
    """The automata of one checkpoint's requests: what names one (``key``) and what builds it (``build``)."""

    def __init__(self, tokenizer, name: str = ""):
        self.tokenizer, self.name = tokenizer, name
        self._pieces = None

    @property
    def pieces(self) -> list[str]:
        if self._pieces is None:
            self._pieces = self.tokenizer.pieces(range(self.tokenizer.vocab_size))
        return self._pieces

    def key(self, regex: str | None, grammar: str | None, prompt: str | None) -> tuple | None:
        """What names the request's automaton (None: unconstrained): checkpoint, field, text and the prompt's
        tokens when it is a prefix. Raises ``Unsupported`` naming the field and the rule."""
        if regex is None and grammar is None:
            return None
        if regex is not None and grammar is not None:
            raise Unsupported("grammar", "give regex or grammar, not both")
        field = "regex" if regex is not None else "grammar"
        if grammar is not None and grammar not in grammars_of(self.tokenizer):
            offered = ", ".join(grammars_of(self.tokenizer)) or "none"
            raise Unsupported("grammar", f"grammar {grammar!r} is not offered for this checkpoint's "
                                         f"{self.tokenizer.kind} tokens (offered: {offered})")
        prefix = () if not prompt or MASK in prompt else tuple(self.tokenizer.tokenize(prompt))
        return self.name, field, regex if regex is not None else grammar, prefix

    def of(self, regex: str | None, grammar: str | None, prompt: str | None):
        """The request's automaton, built now (None: unconstrained); ``key`` and ``build`` in one (benchmarks)."""
        key = self.key(regex, grammar, prompt)
        return None if key is None else self.build(key)

    def build(self, key: tuple):
        """The automaton ``key`` names (seconds for a regex over a text vocabulary: never on the event loop).
        Raises ``Unsupported`` (a bad or empty language) or ``Overloaded`` (too many builds at once)."""
        _, field, text, prefix = key
        pad = self.tokenizer.pad_id
        if not BUILDS.acquire(timeout=BUILD_WAIT_S):
            raise Overloaded("other constraints are being built; try again shortly", retry_after_s=2)
        try:
            dfa = regex_dfa(text, self.pieces, pad) if field == "regex" else GRAMMARS[text].build(self.pieces, pad)
            if prefix:
                dfa = dfa.with_prefix(prefix)
        except ConstraintError as e:
            raise Unsupported(field, f"{field}: {e}") from None
        finally:
            BUILDS.release()
        return dfa
