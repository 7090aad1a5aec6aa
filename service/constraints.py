"""A request's constraint (``regex`` or ``grammar``) as the automaton its run draws within
(``ttcore.constraints``), built once per checkpoint and text and kept (``CACHE_SIZE`` a checkpoint). A prefix
prompt (no [MASK]) is followed by text matching the regex: the automaton reads the prompt's tokens first; a
template's whole text (and no prompt's) must match it."""

import threading
from collections import OrderedDict

from ttcore.constraints import ConstraintError, regex_dfa, smiles_dfa
from ttcore.tokenizers.symbols import MASK

from .refusals import Overloaded, Unsupported

CACHE_SIZE = 64  # automata kept per checkpoint (a regex's over a text vocabulary takes ~0.1 s to build)
BUILDS = threading.BoundedSemaphore(2)  # automata built at once, server-wide: a regex's is a child process of up
# to 3 s and 1 GB (``ttcore.constraints.regex``), so many strangers' patterns cannot exhaust the machine
BUILD_WAIT_S = 5.0  # a request whose build cannot start within this is refused 503 (Retry-After)
GRAMMARS = {"smiles": smiles_dfa}  # grammar name -> builder over a tokenizer's pieces; for the kinds below
GRAMMAR_KINDS = {"smiles": ("smiles",)}  # grammar name -> the tokenizer kinds it reads


def grammars_of(tokenizer) -> tuple[str, ...]:
    """The grammars a checkpoint with this tokenizer offers (``GET /models``)."""
    return tuple(name for name, kinds in GRAMMAR_KINDS.items() if tokenizer.kind in kinds)


class Constraints:
    """The automata of one checkpoint's requests, built on first use and kept (least recently used dropped)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._pieces = None
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()  # ``Serving.admit`` builds on a thread; ``submit`` reads on the loop

    @property
    def pieces(self) -> list[str]:
        if self._pieces is None:
            self._pieces = self.tokenizer.pieces(range(self.tokenizer.vocab_size))
        return self._pieces

    def of(self, regex: str | None, grammar: str | None, prompt: str | None):
        """The request's automaton (None: unconstrained). Raises ``Unsupported`` naming the field and the rule."""
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
        key = (field, regex if regex is not None else grammar, prefix)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        pad = self.tokenizer.pad_id
        if not BUILDS.acquire(timeout=BUILD_WAIT_S):
            raise Overloaded("other constraints are being built; try again shortly", retry_after_s=2)
        try:
            dfa = regex_dfa(regex, self.pieces, pad) if regex is not None else GRAMMARS[grammar](self.pieces, pad)
            if prefix:
                dfa = dfa.with_prefix(prefix)
        except ConstraintError as e:
            raise Unsupported(field, f"{field}: {e}") from None
        finally:
            BUILDS.release()
        with self._lock:
            self._cache[key] = dfa
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return dfa
