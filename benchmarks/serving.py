"""The serving numbers people compare, at fixed concurrency: time to first token (TTFT), inter-token latency (ITL:
here the gap between stream chunks, one per denoising step that commits anything), output tokens/s and
requests/s, p50 / p99, and the error rate. For text the TTFT and ITL are guidellm's (its ITL: the time per
output token after the first, as vLLM's benchmark defines it); for molecules ITL is the gap between step events.

    python benchmarks/serving.py                                      # text and molecules at 1, 8, 32, 64 clients
    python benchmarks/serving.py --concurrency 1 2 --requests 2       # smoke size (the tests run it)
    python benchmarks/serving.py --url http://HOST:8000               # a server already running

Text goes through guidellm (vLLM's benchmark client, a maintained tool: ``--guidellm PATH``, default the one
in ``.venv-guidellm/`` that ``bash dev.sh test`` installs, else ``guidellm`` on PATH) against
``/v1/completions`` (``--route chat`` for ``/v1/chat/completions``): synthetic prompts of ``--prompt-tokens``
tokens and ``--output-tokens`` completion tokens with ``ignore_eos``, counted by the model's own tokenizer
(written as a Hugging Face tokenizer for guidellm), ``--requests`` requests per client in a closed loop.
Molecules go through our own streaming client against ``/generate`` (guidellm speaks only OpenAI's routes):
one molecule a request, the same columns, where a token is a committed SMILES token.

Starts ``python -m service`` on the bundled checkpoints (``--precision``) unless ``--url`` is given. Prints
one table a route; ``--out DIR`` keeps guidellm's JSON and a ``serving.json`` of every row.
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _server import start

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("clients", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "errors")


def _start(args) -> tuple[str, subprocess.Popen]:
    proc, url = start([sys.executable, "-m", "service", "--checkpoints", args.checkpoints, "--log-level", "warning",
                       "--precision", args.precision, "--device", args.device, "--max-requests",
                       max(64, max(args.concurrency))], cwd=ROOT)
    return url, proc


def _guidellm(path: str | None) -> str:
    local = ROOT / ".venv-guidellm" / "bin" / "guidellm"
    found = path or (str(local) if local.exists() else shutil.which("guidellm"))
    if not found:
        raise SystemExit("guidellm not found: bash dev.sh test installs it in .venv-guidellm/, or pass --guidellm")
    return found


def _hf_tokenizer(url: str, model: str, checkpoints: str, into: Path) -> Path:
    """The served text checkpoint's BPE as a Hugging Face tokenizer directory (guidellm counts tokens with it)."""
    name = next(m["checkpoint"] for m in httpx.get(url + "/models").json()["models"] if m["model"] == model)
    saved = json.loads((Path(checkpoints) / name / "tokenizer.json").read_text())
    if "bpe" not in saved:
        raise SystemExit(f"{name}'s tokenizer is not a BPE: guidellm cannot count its tokens")
    into.mkdir(parents=True, exist_ok=True)
    (into / "tokenizer.json").write_text(json.dumps(saved["bpe"]))
    (into / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "model_max_length": saved["length"]}))
    return into


def _text_rows(args, url: str, work: Path) -> list[dict]:
    """One guidellm run per concurrency level against the text family; its JSON read into our columns."""
    tokenizer = _hf_tokenizer(url, args.text_model, args.checkpoints, work / "tokenizer")
    route = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}[args.route]
    rows = []
    for c in args.concurrency:
        out = work / f"guidellm-{args.route}-{c}.json"
        backend = {"kind": "openai_http", "target": url, "model": args.text_model, "request_format": route,
                   "extras": {"body": {"steps": args.steps, "ignore_eos": True}}}
        cmd = [_guidellm(args.guidellm), "run", "--backend", json.dumps(backend),
               "--profile", f"kind=concurrent,streams={c}",
               "--constraint", f"kind=max_requests,count={c * args.requests}",
               "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
               "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--disable-console",
               "--output", f"kind=json,path={out}"]
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                              env=dict(os.environ, HF_HUB_OFFLINE="1"))
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"guidellm failed ({done.returncode}): {done.stderr[-3000:]}")
        m = json.loads(out.read_text())["benchmarks"][0]["metrics"]
        totals = m["request_totals"]
        rows.append({"clients": c, "req/s": m["requests_per_second"]["successful"]["mean"],
                     "out tok/s": m["output_tokens_per_second"]["successful"]["mean"],
                     "TTFT p50 ms": m["time_to_first_token_ms"]["successful"]["percentiles"]["p50"],
                     "TTFT p99 ms": m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"],
                     "ITL p50 ms": m["inter_token_latency_ms"]["successful"]["percentiles"]["p50"],
                     "ITL p99 ms": m["inter_token_latency_ms"]["successful"]["percentiles"]["p99"],
                     "errors": (totals["errored"] + totals["incomplete"]) / max(1, totals["total"])})
    return rows


async def _molecule_client(http, url: str, body: dict, n: int, out: list) -> None:
    """``n`` streamed requests in a row; per request (ok, TTFT s, the gaps between step events, tokens, latency)."""
    for _ in range(n):
        t0 = time.perf_counter()
        first, last, gaps, tokens, ok = None, None, [], 0, False
        try:
            async with http.stream("POST", url + "/generate", json=body) as r:
                event = None
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "step":
                        now = time.perf_counter()
                        if first is None:
                            first = now - t0
                        else:
                            gaps.append(now - last)
                        last = now
                        tokens += sum(len(c) for c in json.loads(line[6:]).get("committed", []))
                    elif line.startswith("data: ") and event == "done":
                        ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        out.append((ok, first, gaps, tokens, time.perf_counter() - t0))


def _molecule_row(args, url: str, c: int) -> dict:
    body = {"model": args.molecule_model, "num_samples": 1, "steps": args.steps, "stream": True}
    results: list = []

    async def run():
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=c + 4)) as http:
            t0 = time.perf_counter()
            await asyncio.gather(*[_molecule_client(http, url, body, args.requests, results) for _ in range(c)])
            return time.perf_counter() - t0

    wall = asyncio.run(run())
    good = [r for r in results if r[0]]
    ttft = [r[1] * 1e3 for r in good if r[1] is not None]
    itl = [g * 1e3 for r in good for g in r[2]]
    return {"clients": c, "req/s": len(good) / wall, "out tok/s": sum(r[3] for r in good) / wall,
            "TTFT p50 ms": _pct(ttft, 50), "TTFT p99 ms": _pct(ttft, 99), "ITL p50 ms": _pct(itl, 50),
            "ITL p99 ms": _pct(itl, 99), "errors": 1 - len(good) / max(1, len(results))}


def _pct(values: list[float], p: int) -> float:
    """The p-th percentile (inclusive method; one value is its own percentile), NaN without values."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.median(values) if p == 50 else statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def _print(title: str, rows: list[dict]) -> None:
    print(title)
    print(" | ".join(f"{c:>11}" for c in COLUMNS))
    for r in rows:
        print(" | ".join(f"{r[c]:>11.0f}" if c == "clients" else f"{r[c]:>10.1%} " if c == "errors"
                         else f"{r[c]:>11.1f}" for c in COLUMNS), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start one on --checkpoints)")
    ap.add_argument("--checkpoints", default=str(ROOT / "checkpoints"))
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "auto"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--requests", type=int, default=4, help="requests per client at each level")
    ap.add_argument("--steps", type=int, default=16, help="denoising steps a request")
    ap.add_argument("--text-model", default="text")
    ap.add_argument("--molecule-model", default="qm9", help="the family our /generate client asks (any family: "
                                                               "a token is a committed token)")
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--route", default="completions", choices=["completions", "chat"])
    ap.add_argument("--guidellm", default=None, help="the guidellm executable")
    ap.add_argument("--only", choices=["text", "molecules"], default=None)
    ap.add_argument("--out", default=None, help="keep guidellm's JSON and serving.json here")
    args = ap.parse_args()
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="serving-"))
    work.mkdir(parents=True, exist_ok=True)
    url, proc = (args.url, None) if args.url else _start(args)
    results = {}
    try:
        where = args.url or f"python -m service, bundled checkpoints, {args.precision}, {args.device}"
        if args.only in (None, "text"):
            warm = {"model": args.text_model, "prompt": "The", "max_tokens": 4, "steps": args.steps}
            httpx.post(url + "/v1/completions", json=warm, timeout=600).raise_for_status()  # its kind is timed
            results["text"] = _text_rows(args, url, work)
            _print(f"text ({args.text_model}) through guidellm, /v1/{args.route.replace('chat', 'chat/completions')}: "
                   f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens, ignore_eos, {args.steps} steps, "
                   f"{args.requests} requests a client; {where}", results["text"])
        if args.only in (None, "molecules"):
            body = {"model": args.molecule_model, "num_samples": 1, "steps": args.steps}
            httpx.post(url + "/generate", json=body, timeout=600).raise_for_status()  # warm-up: its kind is timed
            results["molecules"] = [_molecule_row(args, url, c) for c in args.concurrency]
            _print(f"molecules ({args.molecule_model}) through our client, /generate stream: 1 molecule, "
                   f"{args.steps} steps, {args.requests} requests a client; {where}", results["molecules"])
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    (work / "serving.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
