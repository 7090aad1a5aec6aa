"""The playground page in a real headless browser (Debian's chromium driven by Playwright), against a real
uvicorn server on the bundled QM9 checkpoints (TT r=8 beside the rank-1 base): the page loads, a generation
streams step by step, the molecule pictures appear, the side-by-side mode runs both at once. Takes a
screenshot into the test's temporary folder (a test does not change the repository); to refresh the docs'
picture, ``TTCORE_PLAYGROUND_PNG=results/playground.png pytest tests/service/test_playground.py``. The
/depict route and the chemist's options are tested in test_api.py."""

import os
import shutil
import time
from pathlib import Path

import pytest
from servers import start_uvicorn

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium on a closed network: no background fetches, no sandbox as root, a fresh profile (see the env notes)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on this machine (bash dev.sh test installs Debian's chromium when run "
                             "as root with apt); the playground's browser test cannot run without a browser")]


@pytest.fixture(scope="module")
def qm9_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundled")
    for name in ("qm9-tt-r16", "qm9-none-r1"):
        (root / name).symlink_to(ROOT / "checkpoints" / name)
    proc, url = start_uvicorn(root, "--threads", "1")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_playground_streams_both_checkpoints_and_draws_the_molecules(qm9_server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)  # Playwright makes a fresh profile
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(qm9_server + "/")
        # locator waits, not wait_for_function: its string predicate is polled by eval, which the page's CSP
        # (script-src 'self') refuses when the first check is false
        sync_api.expect(page.locator("#checkpoint-a option")).to_have_count(2)
        assert page.input_value("#checkpoint-a") == "qm9-tt-r16" and page.input_value("#checkpoint-b") == "qm9-none-r1"
        page.fill("#steps", "6")
        page.fill("#num-samples", "12")
        page.fill("#seed", "3")
        page.check("#compare")
        # count the step events each pane shows while they stream (both panes update during the run)
        page.evaluate("""() => { window.seen = {}; new MutationObserver(() => {
            for (const p of document.querySelectorAll('.pane')) window.seen[p.dataset.checkpoint] = p.dataset.steps;
        }).observe(document.getElementById('panes'), {subtree: true, attributes: true, childList: true}); }""")
        page.click("#generate")
        page.wait_for_selector("body[data-state=done]", timeout=120_000)
        panes = page.query_selector_all(".pane")
        assert [p.get_attribute("data-checkpoint") for p in panes] == ["qm9-tt-r16", "qm9-none-r1"]
        assert all(p.get_attribute("data-done") == "1" for p in panes), [p.inner_text()[:300] for p in panes]
        assert all(p.get_attribute("data-steps") == "6" for p in panes)  # one update per denoising step
        assert page.evaluate("window.seen") == {"qm9-tt-r16": "6", "qm9-none-r1": "6"}
        for pane in panes:
            cells = pane.query_selector_all(".mol")
            valid = pane.query_selector_all(".mol.valid")
            assert len(cells) == 12 and valid, pane.inner_text()[:300]
            # every valid molecule got its picture, drawn by the server (an SVG from /depict, loaded)
            loaded = ("(pane) => [...pane.querySelectorAll('.mol.valid img')]"
                      ".every(i => i.complete && i.naturalWidth > 0)")
            deadline = time.monotonic() + 30
            while not page.evaluate(loaded, pane) and time.monotonic() < deadline:  # evaluate is CSP-exempt
                time.sleep(0.1)
            assert page.evaluate(loaded, pane)
            assert len(pane.query_selector_all(".mol.valid img")) == len(valid)
            assert "valid " in pane.query_selector(".summary").inner_text()
        assert page.query_selector_all(".tok.new") == []  # the final answer replaces the step view
        # an invalid molecule's tile (no picture) is as tall as a tile with one: rows do not collapse to strips
        heights = {kind: [el.bounding_box()["height"] for el in page.query_selector_all(f".mol.{kind}")]
                   for kind in ("valid", "invalid")}
        if heights["valid"] and heights["invalid"]:
            assert min(heights["invalid"]) >= 0.8 * max(heights["valid"]), heights
        assert not errors, errors
        out = Path(os.environ.get("TTCORE_PLAYGROUND_PNG") or tmp_path / "playground.png")
        page.screenshot(path=str(out), full_page=True)
        assert out.stat().st_size > 20_000
        # the same checkpoint on both sides: its joint draw beside its rank-1 view (joint: false)
        page.select_option("#checkpoint-b", "qm9-tt-r16")
        page.fill("#steps", "3")
        page.click("#generate")
        page.wait_for_selector("body[data-state=done]", timeout=120_000)
        titles = [t.inner_text() for t in page.query_selector_all(".pane .title")]
        assert len(titles) == 2 and "rank-1 view" not in titles[0] and "rank-1 view" in titles[1], titles
        assert all(p.get_attribute("data-done") == "1" for p in page.query_selector_all(".pane"))
        assert not errors, errors
        browser.close()


def test_api_docs_render_with_the_network_blocked(qm9_server):
    """/docs (Swagger UI) and /redoc load their scripts from the server itself (fastapi-offline): with every
    request to another origin refused, the operations still render."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        elsewhere = []

        def only_the_server(route):
            if route.request.url.startswith(qm9_server):
                return route.continue_()
            elsewhere.append((route.request.resource_type, route.request.url))
            return route.abort()
        page.route("**/*", only_the_server)
        page.goto(qm9_server + "/docs")
        page.wait_for_selector(".opblock", timeout=30_000)
        operations = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.textContent)")
        assert {"/generate", "/score", "/v1/completions", "/models"} <= {o.strip().replace("\u200b", "")
                                                                          for o in operations}
        page.goto(qm9_server + "/redoc")
        page.locator("h2", has_text="generate").first.wait_for(timeout=30_000)  # ReDoc's operation headings
        browser.close()
    # nothing the pages run on comes from elsewhere (ReDoc's "powered by" logo, an image, may be asked for)
    assert not [url for kind, url in elsewhere if kind in ("script", "stylesheet", "fetch", "xhr")], elsewhere
