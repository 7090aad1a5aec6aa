"""The model worker's schedule on a real server (the bundled text checkpoint, whose /score pieces take a good
fraction of a second): a generation step runs between any two pieces of other work (/score pieces), however
many scores are queued. Counted, not timed: the worker's own count of the pieces run between two steps of one
request (``ttcore_worker_pieces_between_steps``)."""

import threading
import time

import httpx
import pytest
from common import metric
from servers import ROOT, uvicorn_server

pytestmark = pytest.mark.slow  # a server

NAME = "ttcore_worker_pieces_between_steps"


def _counts(url: str) -> tuple[float, float, float]:
    """(steps observed, of them after at most one piece, /score pieces run) of the text model."""
    text = httpx.get(url + "/metrics").text
    return (metric(text, f"{NAME}_count", 'model="text"'), metric(text, f"{NAME}_bucket", 'le="1.0",model="text"'),
            metric(text, "ttcore_score_pieces_total", 'model="text"'))


def test_five_scores_queued_never_run_more_than_one_piece_between_two_generation_steps(tmp_path):
    (tmp_path / "text-tt-r4").symlink_to(ROOT / "checkpoints" / "text-tt-r4")
    score = {"model": "text", "sequences": ["The Congress shall make no law"], "mode": "elbo", "num_mc": 12}
    gen = {"model": "text", "num_samples": 1, "steps": 8, "seed": 0}
    with uvicorn_server(tmp_path) as url:  # precision auto: forced bf16 on a CPU without it is slow
        assert httpx.post(url + "/generate", json=gen, timeout=120).status_code == 200  # its kind timed first
        assert httpx.post(url + "/score", json=dict(score, num_mc=1), timeout=120).status_code == 200
        steps, at_most_one, pieces = _counts(url)
        answers = []
        scores = [threading.Thread(target=lambda: answers.append(httpx.post(url + "/score", json=score, timeout=600)))
                  for _ in range(5)]
        for t in scores:
            t.start()
        deadline = time.time() + 120  # a hang guard: the five scores are running (a piece of each counted)
        while _counts(url)[2] < pieces + 5:
            assert time.time() < deadline, "the scores never started"
            time.sleep(0.02)
        generated = httpx.post(url + "/generate", json=gen, timeout=600)
        steps_after, at_most_one_after, pieces_during = _counts(url)
        for t in scores:
            t.join()
        left = _counts(url)[2] - pieces_during
    assert generated.status_code == 200 and all(r.status_code == 200 for r in answers), generated.text[:200]
    assert steps_after - steps == 7  # its steps after the first, each counted
    assert at_most_one_after - at_most_one == 7  # and each waited for at most one piece of the 5 scores' work
    assert left > 0  # the scores were still queued when it finished: it did not simply run after them
