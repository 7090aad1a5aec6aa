"""Constrained requests against a real server on the bundled text checkpoint (8,192 tokens, 128 positions), as a
stranger sends them: the event loop is never held by a constraint's build or its checks (counted by the
server's own loop probe: no wake-up late by half a second while the docs' worst patterns are admitted or
refused), refused requests keep no automaton, an admitted one keeps a compact one, and the build's bounds hold
(a state count past the limit refused before the token walk; a crash named as one, not as the memory limit;
a character no token writes named)."""

import threading

import httpx
import pytest
from common import metric
from servers import ROOT, uvicorn_server

pytestmark = pytest.mark.slow  # a server

WORST = [  # the issue's 64-byte request, the docs' patterns, the nested repetition, the crash and the non-token
    {"model": "text", "num_samples": 1, "steps": 1, "regex": "[a-z ]{0,500}", "timeout_s": 2},
    {"model": "text", "num_samples": 1, "steps": 4, "regex": "[a-z ]{10,40}"},
    {"model": "text", "num_samples": 1, "steps": 4, "regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"},
    {"model": "text", "num_samples": 1, "steps": 4, "regex": "((a{1,9}){1,9}){1,9}"},
    {"model": "text", "num_samples": 1, "steps": 4, "regex": "(?!)"},
    {"model": "text", "num_samples": 1, "steps": 4, "regex": "é{2,5}"},
]


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundled-text")
    (root / "text-tt-r4").symlink_to(ROOT / "checkpoints" / "text-tt-r4")
    with uvicorn_server(root) as url:
        yield url


def _lag(url: str) -> tuple[float, float]:
    """(probe wake-ups, of them late by at most 0.5 s)."""
    text = httpx.get(url + "/metrics").text
    return (metric(text, "ttcore_event_loop_lag_seconds_count"),
            metric(text, "ttcore_event_loop_lag_seconds_bucket", 'le="0.5"'))


def test_the_loop_is_never_held_while_the_worst_constrained_requests_are_admitted_or_refused(text_server):
    url = text_server
    assert httpx.post(url + "/generate", json={"model": "text", "num_samples": 1, "steps": 2},
                      timeout=120).status_code == 200  # the model's first use out of the way
    wakes, prompt = _lag(url)
    polls, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            polls.append(httpx.get(url + "/health", timeout=60).status_code)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        answers = [httpx.post(url + "/generate", json=body, timeout=300) for body in WORST]
    finally:
        stop.set()
        poller.join()
    wakes_after, prompt_after = _lag(url)
    assert wakes_after - wakes > 20 and wakes_after - wakes == prompt_after - prompt  # no wake-up half a second late
    assert polls and set(polls) == {200}
    said = {body["regex"]: (r.status_code, r.text) for body, r in zip(WORST, answers)}
    assert said["[a-z ]{10,40}"][0] == 200 and said["[0-9]{4}-[0-9]{2}-[0-9]{2}"][0] == 200, said
    assert said["((a{1,9}){1,9}){1,9}"][0] == 422 and "731 automaton states" in said["((a{1,9}){1,9}){1,9}"][1]
    assert said["(?!)"][0] == 422 and "MB" not in said["(?!)"][1] and "empty" in said["(?!)"][1]
    assert said["é{2,5}"][0] == 422 and "no token of this model writes 'é'" in said["é{2,5}"][1]


def test_refused_requests_keep_no_automaton_and_an_admitted_one_keeps_a_compact_one(text_server):
    url = text_server

    def kept() -> tuple[float, float]:
        text = httpx.get(url + "/metrics").text
        return metric(text, "ttcore_automaton_cache_entries"), metric(text, "ttcore_automaton_cache_bytes")

    entries, size = kept()
    for i in range(6):  # distinct ~500-state patterns, each refused after its automaton is built (no step fits)
        body = {"model": "text", "num_samples": 1, "steps": 1, "regex": f"[a-z ]{{{i},49{i}}}", "timeout_s": 0.01}
        r = httpx.post(url + "/generate", json=body, timeout=300)
        assert r.status_code == 422, r.text
        body = {"model": "text", "regex": f"[a-y ]{{{i},49{i}}}", "joint": False}  # refused before any build
        assert httpx.post(url + "/generate", json=body, timeout=300).status_code == 422
    assert kept() == (entries, size)
    body = {"model": "text", "num_samples": 1, "steps": 2, "regex": "[a-z ]{10,490}"}
    assert httpx.post(url + "/generate", json=body, timeout=300).status_code == 200
    entries_after, size_after = kept()
    assert entries_after == entries + 1 and 0 < size_after - size < 100_000  # not the [Q, V] table's 33 MB
