"""docs/SERVE.md's nginx configuration, as written there, in front of two `strata serve` replicas:
requests reach both, streams pass through as they come, and a full replica's 429 is retried on the
other. Skipped where nginx is not installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import httpx
import openai
import pytest

import strata
from strata.serve import Server, listen

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "SERVE.md")
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")


def _doc_config() -> str:
    text = open(DOC, encoding="utf-8").read()
    return re.search(r"```nginx\n(.*?)```", text, re.S).group(1)


def _free_port() -> int:
    s = listen("127.0.0.1", 0)
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def proxy(make_mix, tmp_path_factory):
    path = make_mix("f32")
    a, b = (Server(strata.Model(path, progress=False, ctx=512), port=0, parallel=1, queue=0).start()
            for _ in range(2))
    port = _free_port()
    conf = _doc_config().replace("listen 8080", f"listen 127.0.0.1:{port}")
    conf = conf.replace("127.0.0.1:8081", f"127.0.0.1:{a.port}").replace("127.0.0.1:8082", f"127.0.0.1:{b.port}")
    d = tmp_path_factory.mktemp("nginx")
    temps = " ".join(f"{k}_temp_path {d}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (d / "nginx.conf").write_text(
        f"daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\n"
        f"events {{ worker_connections 64; }}\nhttp {{ access_log off; {temps}\n{conf}\n}}\n")
    p = subprocess.Popen([NGINX, "-p", str(d), "-c", str(d / "nginx.conf")], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert p.poll() is None and time.monotonic() - t0 < 10, p.stderr.read() if p.poll() is not None else ""
        time.sleep(0.05)
    yield url, a, b
    p.terminate()
    p.wait(5)
    a.stop()
    b.stop()


def _served(s: Server) -> int:
    return s.engine.counters.finished


def test_requests_and_streams_pass_through(proxy):
    url, a, b = proxy
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    before = (_served(a), _served(b))
    for _ in range(4):
        r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                      temperature=0)
        assert r.usage.completion_tokens >= 1
    assert _served(a) > before[0] and _served(b) > before[1]  # both replicas took requests
    chunks = list(c.completions.create(model="x", prompt="Hello", max_tokens=8, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True}))
    direct = openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0).completions.create(
        model="x", prompt="Hello", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].text for ch in chunks) == direct.choices[0].text
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason == "length"


def test_a_full_replica_is_skipped(proxy):
    url, a, b = proxy
    body = {"prompt": "Count:", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=10) as hc, hc.stream("POST", b.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()  # kept: dropping the iterator closes the stream
        next(lines)
        assert httpx.post(b.url + "/v1/completions", json={"prompt": "x"}).status_code == 429  # b is full
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        before = _served(a)
        for _ in range(3):  # whichever replica nginx tries first, a's answer comes back
            r = c.completions.create(model="x", prompt="Hi", max_tokens=2, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 2
        assert _served(a) == before + 3
