"""`strata serve`'s flags: the load flags are generate's (names, defaults, checks), its own flags
refuse bad values in one line, a taken port is said before the load, and the help is complete."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from strata.cli import main
from strata.serve import is_loopback, listen
from test_cli_flags import CTX_FLAGS, FIX_WORDS, LOAD_FLAGS


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def f16(make_mix) -> str:
    return make_mix("f16")


def _options(name: str) -> dict[str, click.Option]:
    return {p.name: p for p in main.commands[name].params if isinstance(p, click.Option)}


def test_load_flags_are_generates():
    gen, srv = _options("generate"), _options("serve")
    load = ("device", "kv_type", "expert_cache", "prefill", "source", "ctx", "threads", "quiet", "model_opt")
    for name in load:
        g, s = gen[name], srv[name]
        assert (s.opts, s.default, s.help, type(s.type)) == (g.opts, g.default, g.help, type(g.type)), name
    # --cache-policy: generate's values, and serve's auto (its default)
    g, s = gen["cache_policy"], srv["cache_policy"]
    assert s.opts == g.opts and s.default == "auto" and list(s.type.choices) == ["auto", *g.type.choices]
    assert s.help.startswith(g.help) and "auto: scan with --parallel > 1" in s.help


def test_serve_policy_auto():
    from strata.cli import _serve_policy

    assert _serve_policy("auto", 1, False) == "lru"
    assert _serve_policy("auto", 4, False) == "scan"
    assert _serve_policy("auto", 4, True) == "lru"  # --prefetch on is LRU's
    assert all(_serve_policy(p, 4, False) == p for p in ("lru", "lfu", "scan"))


SERVE_FLAGS = [
    (["--port", "-1"], "--port"),
    (["--port", "70000"], "--port"),
    (["--port", "http"], "--port"),
    (["--parallel", "0"], "--parallel"),
    (["-np", "x"], "--parallel"),
    (["--queue", "-1"], "--queue"),
    (["--turn", "0"], "--turn"),
    (["--api-key", " "], "--api-key"),
    (["--host", "no.such.host.invalid"], "cannot listen"),
    (["-ngl", "99"], "-ngl 99"),
]


@pytest.mark.parametrize("flags, needle", LOAD_FLAGS + CTX_FLAGS + SERVE_FLAGS,
                         ids=[" ".join(f) for f, _ in LOAD_FLAGS + CTX_FLAGS + SERVE_FLAGS])
def test_bad_value_is_one_line_naming_the_flag(f16, flags, needle):
    r = run("serve", f16, "--port", "0", *flags)
    assert r.exit_code == 2, (r.output, r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("strata: error: "), r.stderr
    assert needle in lines[0] and (any(w in lines[0] for w in FIX_WORDS) or "llama.cpp" in lines[0]), lines[0]
    assert "Traceback" not in r.output


def test_taken_port_is_said_before_the_load(f16):
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        r = run("serve", "/nonexistent/model.gguf", "--port", str(port))
        assert r.exit_code == 2
        assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr
    finally:
        taken.close()


def test_loopback():
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.4", "example.com"))


def test_help_is_complete():
    cmd = main.commands["serve"]
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            assert p.help, p.name
            shows = p.show_default or "[default:" in p.help or p.is_flag or p.default is None or p.multiple
            assert shows, p.name
    r = run("serve", "--help")
    assert r.exit_code == 0
    for word in ("/v1/chat/completions", "--parallel", "--api-key", "--expert-cache", "429", "SIGTERM"):
        assert word in r.stdout, word
    bare = run()
    line = next(ln for ln in bare.stdout.splitlines() if ln.startswith("  serve "))
    assert line.endswith(".")
