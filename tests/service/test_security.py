"""API keys, the body limit and CORS on a real uvicorn server (subprocess), keys from the environment."""

import socket
from urllib.parse import urlparse

import httpx
import pytest
from servers import ROOT, start_uvicorn

KEY = "ttcore-test-key-0123456789abcdef"
OTHER = "another-valid-key-fedcba9876543210"
AUTH = {"authorization": f"Bearer {KEY}"}
BODY = {"model": "qm9", "num_samples": 2, "steps": 4, "seed": 0}


pytestmark = pytest.mark.slow  # servers, Ray, training or end-to-end commands


@pytest.fixture(scope="module")
def keyed(checkpoints, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# service keys\n{OTHER}\n")
    proc, url = start_uvicorn(checkpoints, "--api-key-file", str(key_file), "--cors-origins", "https://ok.example",
                              env={"TTCORE_API_KEY": KEY})
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer made-up-token-1234567890"},
                                     {"authorization": f"Bearer {KEY[:-1]}X"}, {"authorization": f"Basic {KEY}"},
                                     {"authorization": "Bearer"}])
def test_missing_or_wrong_key_is_401(keyed, headers):
    for method, path in (("POST", "/generate"), ("GET", "/models"), ("GET", "/metrics"), ("GET", "/openapi.json")):
        r = httpx.request(method, keyed + path, json=BODY if method == "POST" else None, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer") and "API key" in r.json()["detail"]
        assert KEY not in r.text


def test_right_keys_get_json_streaming_and_models(keyed):
    r = httpx.post(keyed + "/generate", json=BODY, headers=AUTH, timeout=60)
    assert r.status_code == 200 and len(r.json()["samples"]) == 2, r.text
    r = httpx.get(keyed + "/models", headers={"authorization": f"bearer {OTHER}"})  # the file's key; any case
    assert r.status_code == 200 and r.json()["models"]
    with httpx.stream("POST", keyed + "/generate", json=dict(BODY, stream=True), headers=AUTH, timeout=60) as s:
        assert s.status_code == 200 and "event: done" in s.read().decode()
    assert httpx.get(keyed + "/metrics", headers=AUTH).status_code == 200


def test_health_and_ready_stay_open(keyed):
    assert httpx.get(keyed + "/health").status_code == 200
    ready = httpx.get(keyed + "/ready")
    assert ready.status_code == 200 and "broken" in ready.json()["refused"]


def test_body_over_the_limit_is_413_without_reading_it(keyed):
    r = httpx.post(keyed + "/generate", content=b"{" + b" " * (2 << 20) + b"}", headers=dict(AUTH, **{
        "content-type": "application/json"}))
    assert r.status_code == 413 and "limit" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(40):
            yield b" " * 65536

    r = httpx.post(keyed + "/generate", content=chunks(), headers=dict(AUTH, **{"content-type": "application/json"}))
    assert r.status_code == 413
    # a declared length far beyond the limit is refused before any body byte is sent
    host, port = urlparse(keyed).hostname, urlparse(keyed).port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100000000\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")


def test_cors_headers_only_for_allowed_origins(keyed):
    ok = httpx.options(keyed + "/generate", headers={"origin": "https://ok.example",
                                                     "access-control-request-method": "POST"})
    assert ok.headers.get("access-control-allow-origin") == "https://ok.example"
    bad = httpx.options(keyed + "/generate", headers={"origin": "https://evil.example",
                                                      "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in bad.headers
    r = httpx.get(keyed + "/models", headers=dict(AUTH, origin="https://evil.example"))
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_no_answer_reveals_a_path(keyed, checkpoints):
    answers = [httpx.get(keyed + p, headers=AUTH).text for p in ("/ready", "/models", "/health", "/nope")]
    answers += [httpx.post(keyed + "/generate", json=b, headers=AUTH).text
                for b in ({"model": "nope"}, {"prompt": "CXC"}, {"steps": 0})]
    for text in answers:  # neither the checkpoints' location nor any other absolute path (cards included)
        assert str(checkpoints) not in text and "/tmp/" not in text, text


def test_open_server_has_no_cors_and_no_key_check(server):
    r = httpx.get(server + "/models", headers={"origin": "https://ok.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_per_key_concurrency_and_rate_limits_answer_429_and_count_per_key_id(checkpoints):
    proc, url = start_uvicorn(checkpoints, "--key-max-concurrency", "1", "--key-rate-per-minute", "4",
                              env={"TTCORE_API_KEY": f"{KEY},{OTHER}"})
    other = {"authorization": f"Bearer {OTHER}"}
    try:
        with httpx.stream("POST", url + "/generate", headers=AUTH, timeout=60,
                          json=dict(model="text", num_samples=64, steps=1000, ordering="entropy", stream=True)) as r:
            lines = r.iter_lines()
            while not next(lines).startswith("data: "):
                pass  # key1 now has one request in flight
            busy = httpx.post(url + "/generate", json=BODY, headers=AUTH)
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert "key1" in busy.json()["detail"] and "in flight" in busy.json()["detail"]
            assert httpx.post(url + "/generate", json=BODY, headers=other, timeout=60).status_code == 200  # key2 free
        codes = [httpx.post(url + "/generate", json=BODY, headers=other, timeout=60).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]  # key2's bucket of 4 per minute is empty after 4 requests
        limited = httpx.post(url + "/generate", json=BODY, headers=other)
        assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 15
        text = httpx.get(url + "/metrics", headers=AUTH).text
        assert 'ttcore_key_limited_total{key="key1",reason="concurrency"} 1.0' in text
        assert 'ttcore_key_limited_total{key="key2",reason="rate"} 2.0' in text
        assert KEY not in text and OTHER not in text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_keys_and_limits_under_ray_serve(checkpoints, tmp_path):
    """The same keys (read on the replica from api_key_file), 401s and per-key ids through Ray's proxy."""
    from servers import start_ray_serve
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"{KEY}\n")
    proc, url = start_ray_serve({"checkpoints": str(checkpoints), "threads": 1, "api_key_file": str(key_file),
                                 "key_rate_per_minute": 2})
    try:
        assert httpx.post(url + "/generate", json=BODY, timeout=60).status_code == 401
        assert httpx.get(url + "/health").status_code == 200
        codes = [httpx.post(url + "/generate", json=BODY, headers=AUTH, timeout=60).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        text = httpx.get(url + "/metrics", headers=AUTH).text
        assert 'ttcore_key_limited_total{key="key1",reason="rate"} 1.0' in text and KEY not in text
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_security_headers_on_every_route_to_the_page(server):
    for path in ("/", "/playground/index.html", "/playground/playground.js"):
        r = httpx.get(server + path)
        assert r.status_code == 200 and "frame-ancestors 'none'" in r.headers["content-security-policy"], path
        assert r.headers["x-content-type-options"] == "nosniff"
    depict = httpx.get(server + "/depict", params={"smiles": "CCO"})
    assert depict.headers["x-content-type-options"] == "nosniff"


def test_two_authorization_headers_and_foreign_host_names_are_refused(server):
    two = httpx.post(server + "/generate", json={"model": "qm9"},
                     headers=[("authorization", "Bearer a"), ("authorization", "Bearer b")])
    assert two.status_code == 400 and "Authorization" in two.json()["detail"]
    rebinding = httpx.get(server + "/models", headers={"host": "attacker.example"})
    assert rebinding.status_code == 400  # a keyless loopback server: a DNS-rebound page cannot drive it
    port = server.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert httpx.get(server + "/models", headers={"host": host}).status_code == 200, host


def test_slow_clients_are_disconnected_and_urls_are_logged_without_queries(checkpoints):
    import socket
    import subprocess
    import sys

    from servers import free_port, wait_ready

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "service", "--checkpoints", str(checkpoints), "--port", str(port),
                             "--threads", "1", "--precision", "fp32", "--read-timeout-s", "1", "--log-level", "info"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc=proc)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: localhost\r\n")  # half a header, then nothing
            s.settimeout(30)  # a hang guard: the server's 1 s read timeout closes it long before
            assert s.recv(1024) == b""  # closed by the server
        assert httpx.get(url + "/models?api_key=hunter2-secret-value").status_code == 200
    finally:
        proc.terminate()
        log = proc.communicate(timeout=30)[0].decode()
    assert "GET /models?[query not logged]" in log and "hunter2" not in log


def test_a_short_api_key_stops_the_start_with_one_line(checkpoints):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "service", "--checkpoints", str(checkpoints)],
                          env={"TTCORE_API_KEY": "short", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("ttcore: API keys must be at least 16 characters; key(s) "
                                                   "number [1] are shorter")


@pytest.mark.parametrize("head,why", [
    (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
     b"Transfer-Encoding"),
    (b"GET /models HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\n\r\n", b"obs-fold"),
    (b"GET /models HTTP/1.1\nHost: x\n\n", b"bare LF"),
    (b"GET /models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\nX-Injected: 1\r\n\r\n", b"bare LF"),
])
def test_request_heads_that_parsers_read_differently_are_refused(server, head, why):
    """The review: h11 accepted Content-Length with chunked, obs-fold, bare LF and a LF inside Authorization; a
    proxy in front may parse them otherwise (request smuggling). Each gets a 400 naming the rule and a close,
    and a well-formed request on a new connection is answered."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(server)
    with socket.create_connection((u.hostname, u.port)) as s:
        s.sendall(head)
        s.settimeout(30)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400") and why in data, data[:300]
    assert httpx.get(server + "/models").status_code == 200
