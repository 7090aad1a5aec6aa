"""Real servers for the tests: tiny trained checkpoints and uvicorn in a subprocess."""

import contextlib
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import torch
from _loop import fit

from ttcore.data import SmilesDataset
from ttcore.models import JointModel, ModelConfig
from ttcore.recipes import load_config

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "qm9_sample.txt"
TINY = ROOT / "training" / "configs" / "tiny.yaml"


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range and above Ray's worker ports (10002-19999).

    A port the kernel hands out (bind to 0) is free now but is itself an ephemeral port: between this call and the
    server's bind, any process that opens a connection or binds to 0 may take it. Ray starts a dozen processes that
    do exactly that, and CI once saw Serve's proxy fail with "Failed to bind to address '127.0.0.1:46641'". A port
    outside the ephemeral range is only taken by an explicit bind."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768  # Linux's default floor
    rng = random.Random()  # not the tests' seeded global generator: two runs at once must not pick alike
    for _ in range(200):
        port = rng.randrange(20000, max(low, 20001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..ephemeral range")


def wait_ready(url: str, timeout: float = 120, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {stderr_tail(proc)}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def spawn(argv: list, **kw) -> subprocess.Popen:
    """A child process, its stdout discarded and its stderr in a temporary file (``stderr_tail`` reads it): a pipe
    nobody reads fills at 64 KB and then blocks the child (a recipe's log, a server's warnings, Ray's replicas)."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL, stderr=log, **kw)
    proc.log = log
    return proc


def stderr_tail(proc: subprocess.Popen, chars: int = 2000) -> str:
    """The last ``chars`` of a ``spawn``ed process's stderr."""
    proc.log.seek(0)
    return proc.log.read().decode(errors="replace")[-chars:]


def make_checkpoints(root: Path) -> Path:
    """A tiny base MDM trained on the committed QM9 sample, TT and CP fine-tunes of it, and a broken one."""
    cfg = load_config(TINY, ["threads=1", "val_batches=1"])
    ds = SmilesDataset.from_file(SAMPLE)
    tok = ds.tokenizer
    train, val = torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens)
    torch.manual_seed(0)
    base = JointModel(ModelConfig(cfg.model.dit_config(tok)))
    fit(base, tok, train, val, cfg, root / "qm9-base", max_steps=60, quiet=True)
    for dec, rank in (("tt", 2), ("cp", 3)):
        joint = JointModel.from_base(base, dec, rank, "1layer", 0.05, torch.Generator().manual_seed(0))
        fit(joint, tok, train, val, cfg, root / f"qm9-{dec}-r{rank}", max_steps=20, quiet=True)
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text("{truncated")
    tiny_text_model(root / "text-base")
    return root


def make_ar_checkpoint(out: Path, base: Path) -> Path:
    """A tiny autoregressive model (``training/train_ar.py``'s objective) with ``base``'s tokenizer and family,
    trained a few steps on the committed QM9 sample: the AR pair of ``base``."""
    import json

    from ttcore.data import load_dataset
    from ttcore.kinds.autoregressive import ar_loss
    from ttcore.tokenizers import load_tokenizer

    cfg = load_config(TINY, ["threads=1", "val_batches=1", "model.causal=true", f"data.source={SAMPLE}"])
    tok = load_tokenizer(base)
    ds = load_dataset(cfg.data, tok)
    extra = json.loads((base / "config.json").read_text())["model"]["extra"]  # the base's family
    torch.manual_seed(0)
    model = JointModel(ModelConfig(cfg.model.dit_config(tok), extra=dict(extra)))
    fit(model, tok, torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens), cfg, out, max_steps=40,
        quiet=True, objective=ar_loss)
    return out


def assert_in_language(url: str, checkpoint: str, tok, bodies, num_samples: int, seed: int) -> None:
    """Each of ``bodies`` (a ``grammar: smiles`` or a ``regex`` request) on ``checkpoint`` answers 200 with every
    sample in its language (the SMILES automaton over ``tok``'s tokens, or a full match of the regex)."""
    import re

    import httpx

    from ttcore.constraints import smiles_dfa

    grammar = smiles_dfa(tok.pieces(range(tok.vocab_size)), tok.pad_id)
    for body in bodies:
        r = httpx.post(url + "/generate", json={"checkpoint": checkpoint, "num_samples": num_samples, "seed": seed,
                                                **body}, timeout=120)
        assert r.status_code == 200, r.text
        texts = [s["text"] for s in r.json()["samples"]]
        if "grammar" in body:
            assert all(grammar.accepts(tok.encode(t)) for t in texts), texts
        else:
            assert all(re.fullmatch(body["regex"], t) for t in texts), texts


def make_block_checkpoint(out: Path, base: Path, block_size: int = 2, decomposition: str = "tt", rank: int = 2) -> Path:
    """A tiny block diffusion model (``training/train_blocks.py``'s objective, the kind's) with ``base``'s
    tokenizer and family and a ``decomposition`` head of ``rank`` over each block, trained a few steps from scratch
    on the committed QM9 sample."""
    import json

    from ttcore.data import load_dataset
    from ttcore.tokenizers import load_tokenizer

    cfg = load_config(TINY, ["threads=1", "val_batches=1", f"model.block_size={block_size}", f"data.source={SAMPLE}"])
    tok = load_tokenizer(base)
    ds = load_dataset(cfg.data, tok)
    extra = json.loads((base / "config.json").read_text())["model"]["extra"]
    torch.manual_seed(0)
    model = JointModel(ModelConfig(cfg.model.dit_config(tok), decomposition, rank, extra=dict(extra)))
    fit(model, tok, torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens), cfg, out, max_steps=20,
        quiet=True)
    return out


def tiny_text_model(out: Path, length: int = 32) -> None:
    """A tiny text MDM (family text, BPE 512, l = ``length``) trained a few steps on the public-domain corpus."""
    from ttcore.data import load_text, training_texts
    from ttcore.tokenizers.text import train_bpe

    cfg = load_config(TINY, ["threads=1", "val_batches=1", "data=text", "data.family=text"])
    tok = train_bpe(training_texts()[:60], vocab_size=512, length=length)
    ds = load_text(tok)
    torch.manual_seed(0)
    model = JointModel(ModelConfig(cfg.model.dit_config(tok), extra={"family": "text"}))
    fit(model, tok, torch.from_numpy(ds.train_tokens), torch.from_numpy(ds.val_tokens), cfg, out, max_steps=10,
        quiet=True)


@contextlib.contextmanager
def uvicorn_server(checkpoints: Path, *extra: str, env: dict | None = None):
    """``start_uvicorn`` as a context: the server's URL, the server stopped (and waited for) on the way out."""
    proc, url = start_uvicorn(checkpoints, *extra, env=env)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def start_uvicorn(checkpoints: Path, *extra: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    proc = spawn([sys.executable, "-m", "service", "--checkpoints", checkpoints, "--port", port, "--threads", "1",
                  "--log-level", "warning", "--precision", "fp32", *extra], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc=proc)
    except BaseException:
        proc.kill()
        raise
    return proc, url


def start_ray_serve(app_args: dict, env: dict | None = None, *extra: str) -> tuple[subprocess.Popen, str]:
    """``python -m service.deployment``: a fresh local Ray cluster serving the app (stopped on terminate)."""
    import json

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S="60",
               **(env or {}))
    # the replicas' logs reach the driver's stderr (Ray's log_to_driver): a drain of many requests logs a lot
    proc = spawn([sys.executable, "-m", "service.deployment", "--port", port, "--args", json.dumps(app_args), *extra],
                 cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 240, proc)
    except BaseException:
        proc.kill()
        raise
    return proc, url


def page_argv(command: str, values: dict[str, str]) -> list[str]:
    """A docs page's ``python ...`` command as argv: ``$NAME`` replaced by ``values[NAME]`` (longest names first),
    this interpreter for ``python``, the repository's ``training/`` scripts and configs by absolute path."""
    argv = shlex.split(command)
    for name in sorted(values, key=len, reverse=True):
        argv = [a.replace(f"${name}", values[name]) for a in argv]
    assert argv[0] == "python" and not any("$" in a for a in argv), argv
    argv[0] = sys.executable
    return [str(ROOT / a) if a.startswith("training/") else a for a in argv]


def playground_generates(url: str, alphabet: set[str], options: int) -> None:
    """The playground (a real chromium) lists the family's ``options`` checkpoints and shows generated sequences as
    text over ``alphabet``, with no molecule summary; skipped where there is no browser."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    sync_api = pytest.importorskip("playwright.sync_api") if chromium else None
    if sync_api is None:
        return
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url + "/")
        sync_api.expect(page.locator("#checkpoint-a option")).to_have_count(options)  # not wait_for_function: CSP
        page.fill("#steps", "4")
        page.fill("#num-samples", "3")
        page.click("#generate")
        page.wait_for_selector("body[data-state=done]", timeout=120_000)
        seqs = [el.inner_text() for el in page.query_selector_all(".pane .seq")]
        assert len(seqs) == 3 and all(set(q) <= alphabet for q in seqs), seqs
        assert "valid " not in page.query_selector(".pane .summary").inner_text()
        assert not errors, errors
        browser.close()


def check_drain(proc: subprocess.Popen, url: str) -> None:
    """A server's graceful drain, as a client sees it: with a text stream in flight, SIGTERM; then, until the
    stream ends, a stranger polling /ready and sending new requests sees, from the first refusal on, /ready
    503 ``draining`` and every new request refused with 503 and Retry-After (none admitted, none dropped); the
    stream ends with its answer (``done``, no error), and the process exits 0 by itself. Kills the process if
    any of it fails."""
    import signal
    import threading

    events: list[str] = []
    body = dict(model="text", num_samples=2, steps=64, stream=True, seed=0)  # admitted on a CPU without bf16 too

    def read_stream():
        with httpx.stream("POST", url + "/generate", json=body, timeout=300) as r:
            events.extend(line[7:] for line in r.iter_lines() if line.startswith("event: "))

    reader = threading.Thread(target=read_stream)
    try:
        reader.start()
        deadline = time.time() + 120
        while not events and time.time() < deadline:  # the stream is in flight: its first step arrived
            time.sleep(0.05)
        assert events, "no step event within 120 s"
        proc.send_signal(signal.SIGTERM)
        seen = []  # a stranger during the drain: (route, status, Retry-After), /ready and a new request in turn
        deadline = time.time() + 300
        while reader.is_alive() and time.time() < deadline:
            try:
                ready = httpx.get(url + "/ready", timeout=10)
                seen.append(("/ready", ready.status_code, ready.json().get("status")))
                new = httpx.post(url + "/generate", json=dict(model="qm9", num_samples=1, steps=2), timeout=60)
                seen.append(("/generate", new.status_code, new.headers.get("retry-after")))
            except httpx.TransportError:  # the server left: only once the stream in flight has its answer
                reader.join(timeout=60)
                assert events and events[-1] == "done", events[-3:]
                break
            time.sleep(0.05)
        reader.join(timeout=10)
        first = next(i for i, (_, status, _) in enumerate(seen) if status == 503)  # once refused, always refused
        # the SIGTERM may land between a /ready and the request after it, so the first refusal may be that
        # request's; from it on, every /ready says draining (readiness and admission flip together)
        assert any(route == "/ready" for route, _, _ in seen[first:]), seen
        assert all(s == "draining" for route, _, s in seen[first:] if route == "/ready"), seen
        assert all(status == 503 for _, status, _ in seen[first:]), seen
        assert all(int(retry) >= 1 for route, _, retry in seen[first:] if route == "/generate"), seen
        assert any(route == "/generate" for route, _, _ in seen[first:]), seen
        assert events[-1] == "done" and "error" not in events, events[-3:]
        assert proc.wait(timeout=120) == 0  # it left once the stream was answered
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
