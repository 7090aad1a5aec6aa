"""A regular expression as a ``TokenDFA`` over a model's tokens: the decoded text must match it whole (Python's
``re.fullmatch``). The expression becomes a character automaton by ``interegular`` (a pure-Python regex-to-FSM
library, the one outlines used before its Rust core; we chose it over ``outlines-core`` 0.2.14, whose token index
dropped the transition into an optional group here: ``C(\\(O\\))?`` accepted "C" but not "C(O)"), and each token
then moves every state through its characters at once (``ttcore.regex_fsm.token_walk``). Both run in a child
process with one time and memory limit (``bounded_token_automaton``): a nested counted repetition takes
interegular minutes, and the walk of a large automaton over a text vocabulary seconds; neither may hold a server.
A token whose text is not whole characters (a byte-level piece of one) or is empty is never allowed."""

import json
import os
import signal
import subprocess
import sys

import torch

from .dfa import MAX_STATES, ConstraintError, TokenDFA

MAX_PATTERN = 1000  # characters of a pattern
BUILD_SECONDS = 3  # a pattern's token automaton must be built within this much CPU time (in a child process)
BUILD_BYTES = 1 << 30  # and within this much memory
WALL_SECONDS = 4 * BUILD_SECONDS  # and this much wall time: a loaded machine slows a build without making it work more


# one BLAS thread in the child: numpy's BLAS reserves address space per thread at import, which on a many-core
# machine could pass the child's address-space limit before any work (the walk itself uses no BLAS)
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def bounded_token_automaton(pattern: str, pieces: list[str], pad_id: int | None,
                            seconds: int = BUILD_SECONDS) -> dict:
    """``ttcore.regex_fsm``'s character automaton and token walk in a child process (``python -m
    ttcore.regex_fsm``: no torch, a fraction of a second to start), ended past ``seconds`` of CPU time (the
    kernel's limit: the work a pattern costs, whatever the machine's load) or ``WALL_SECONDS``, and limited to
    ``BUILD_BYTES``: a stranger's pattern cannot hold a server's worker, its event loop or its memory. Raises
    ``ConstraintError`` saying which limit, or what the builder reported."""
    if not pattern:
        raise ConstraintError("the pattern is empty")
    if len(pattern) > MAX_PATTERN:
        raise ConstraintError(f"the pattern has {len(pattern)} characters, more than {MAX_PATTERN}")
    ask = json.dumps({"pattern": pattern, "pieces": pieces, "pad": pad_id, "max_states": MAX_STATES})
    try:
        done = subprocess.run([sys.executable, "-m", "ttcore.regex_fsm", str(BUILD_BYTES), str(seconds)],
                              input=ask, capture_output=True, text=True, timeout=WALL_SECONDS,
                              env={**os.environ, **_ONE_THREAD})
    except subprocess.TimeoutExpired:
        raise ConstraintError(f"the pattern's automaton over this model's tokens took more than {WALL_SECONDS} s "
                              "to build") from None
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not done.stdout:
        raise ConstraintError(f"the pattern's automaton over this model's tokens takes more than {seconds} s of "
                              "CPU time to build") from None
    try:
        out = json.loads(done.stdout)
    except ValueError:  # the child died before answering: a signal (its memory limit can end it so) or a crash
        last = (done.stderr.strip().splitlines() or ["no message"])[-1][:200]
        if done.returncode < 0:
            raise ConstraintError(f"the pattern's automaton could not be built: its builder was ended by signal "
                                  f"{-done.returncode} (limits: {seconds} s of CPU, {BUILD_BYTES >> 20} MB)") from None
        raise ConstraintError(f"the pattern's automaton could not be built (exit {done.returncode}: {last})") from None
    if "error" in out:
        raise ConstraintError(out["error"])
    return out


def regex_dfa(pattern: str, pieces: list[str], pad_id: int | None) -> TokenDFA:
    """The tokens' automaton of ``pattern``: ``pieces`` each token's text (``tokenizer.pieces``), ``pad_id`` the
    model's end padding (allowed only after an accepted text). -> a finished ``TokenDFA``."""
    out = bounded_token_automaton(pattern, pieces, pad_id)
    moves = torch.tensor(out["moves"], dtype=torch.long).reshape(len(out["accepting"]), -1)
    dfa = TokenDFA.over_classes(moves, torch.tensor(out["token_class"]), torch.tensor(out["accepting"]))
    try:
        return dfa.finish(pad_id)
    except ConstraintError as e:
        if out["missing"] and "empty" in str(e):
            shown = ", ".join(repr(ch) for ch in out["missing"][:10])
            raise ConstraintError(f"{e}: no token of this model writes {shown}") from None
        raise
