"""`strata chat` through a pseudo-terminal: turns with the history and the system message, answers
streamed, Ctrl-C stopping the current answer only, /reset, /exit and Ctrl-D, --stats per turn."""

from __future__ import annotations

import io
import os
import re
import sys

import pytest

import strata
from strata._interactive import ChatSession
from strata.testing import make_qwen3moe

pexpect = pytest.importorskip("pexpect")

PYTHON_DIR = os.path.dirname(os.path.dirname(strata.__file__))
PROMPT_STATS = re.compile(r"prompt   (\d+) tokens(?: \((\d+) kept in the KV cache from the last turn\))? in")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """Small, but a few hundred tokens a second: an answer of thousands of tokens takes seconds."""
    path = str(tmp_path_factory.mktemp("chat") / "chat.gguf")
    make_qwen3moe(path, layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=16, top_k=4,
                  expert_ffn=256, vocab=1024, quant={"experts": "Q8_0"}, seed=3)
    return path


def spawn(*args: str):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""), TERM="dumb")
    env.pop("STRATA_LOG", None)
    return pexpect.spawn(sys.executable, ["-m", "strata.cli", "chat", *args], env=env, encoding="utf-8",
                         timeout=120, dimensions=(24, 200))


def turn(c, text: str, kept: list[int] | None = None) -> int:
    """Sends one message; returns the prompt tokens of its turn (from --stats), appending to `kept`
    those the KV cache kept from the turn before."""
    c.expect("> ")
    c.sendline(text)
    c.expect(PROMPT_STATS)
    n = int(c.match.group(1))
    if kept is not None:
        kept.append(int(c.match.group(2) or 0))
    c.expect("stop: ")
    return n


def test_turns_keep_the_history_and_the_system_message(model):
    c = spawn(model, "-n", "6", "--temp", "0", "--stats")
    c.expect("strata chat with")
    kept: list[int] = []
    first = turn(c, "hello", kept)
    second = turn(c, "and again", kept)
    assert second > first + 6  # the second prompt holds the first turn, its answer and the new message
    assert kept[0] == 0 and kept[1] >= first - 2  # ... whose beginning was not run again
    c.expect("> ")
    c.sendline("/reset")
    c.expect("forgotten")
    assert turn(c, "hello") == first  # the same conversation from the start
    c.expect("> ")
    c.sendline("/exit")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0

    c = spawn(model, "-n", "6", "--temp", "0", "--stats", "--system", "You are terse.")
    assert turn(c, "hello") > first  # the system message opens the prompt
    c.sendeof()  # Ctrl-D leaves
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def test_ctrl_c_stops_the_answer_only(model):
    c = spawn(model, "--temp", "0", "-c", "4096")
    c.expect("> ")
    c.sendline("tell me everything")
    c.expect(r"\S{20}")  # the answer streams: text arrives before the turn ends
    c.sendintr()
    c.expect(r"\[stopped\]")
    c.expect("> ")  # still in the chat
    c.sendintr()  # at the input line: how to leave, and the chat goes on
    c.expect(r"\(/exit or Ctrl-D leaves")
    c.sendline("/help")
    c.expect("/reset forgets")
    c.sendline("/exit")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0
    assert "Traceback" not in (c.before or "")


def _stop_string_in(text: str) -> str:
    """Three printable characters of `text` (from its fourth on) found first where they are: a stop string
    that the answer completes."""
    for i in range(3, len(text) - 3):
        s = text[i : i + 3]
        if s.isprintable() and "\ufffd" not in s and text.find(s) == i:
            return s
    pytest.fail(f"no stop string to take from {text!r}")


def test_stop_ends_each_answer(model):
    """--stop: the answer ends before the stop string, on the screen and in the history."""
    m = strata.Model(model, progress=False)
    full = ChatSession(m, out=io.StringIO(), err=io.StringIO(), max_tokens=16, temperature=0.0).turn("hello")
    stop = _stop_string_in(full)
    cut = full[: full.find(stop)]
    out = io.StringIO()
    s = ChatSession(m, stop=[stop], out=out, err=io.StringIO(), max_tokens=16, temperature=0.0)
    assert s.turn("hello") == cut and out.getvalue() == cut + "\n"
    assert s.history[-1] == {"role": "assistant", "content": cut}

    c = spawn(model, "-n", "16", "--temp", "0", "--stop", "\x01never", "--stop", stop)
    c.expect("> ")
    c.sendline("hello")
    c.expect("> ")
    assert c.before.replace("\r\n", "\n") == "hello\n" + cut + "\n"
    c.sendline("/exit")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def test_a_stopped_answer_stays_in_the_history(model):
    """In process: the part of an answer shown before Ctrl-C is the assistant's turn."""
    m = strata.Model(model, progress=False)
    out, err = io.StringIO(), io.StringIO()
    s = ChatSession(m, system="Be brief.", out=out, err=err, max_tokens=8, temperature=0.0)
    answer = s.turn("hello")
    assert answer and out.getvalue().startswith(answer)
    assert [h["role"] for h in s.history] == ["system", "user", "assistant"]
    assert s.history[-1]["content"] == answer
    again = s.turn("more")
    assert len(s.history) == 5 and s.history[-1]["content"] == again
    s.reset()
    assert s.history == [{"role": "system", "content": "Be brief."}]


def test_a_turn_past_the_context_is_one_line_and_the_chat_goes_on(model):
    m = strata.Model(model, progress=False, ctx=24)
    out, err = io.StringIO(), io.StringIO()
    s = ChatSession(m, out=out, err=err, max_tokens=24, temperature=0.0)
    assert s.turn("word " * 40) == ""
    assert err.getvalue().count("\n") == 1 and "strata: error: the prompt has" in err.getvalue()
    assert s.history == []
    s.turn("hi")
    assert len(s.history) == 2


def test_turns_reuse_the_kv_cache(model):
    """reuse_kv: a turn runs only what follows the history's common beginning, to the same tokens."""
    m = strata.Model(model, progress=False)
    fresh = strata.Model(model, progress=False)
    msgs = [{"role": "user", "content": "hello"}]
    a = m.chat(msgs, max_tokens=12, temperature=0, reuse_kv=True)
    assert a.stats["prompt_reused"] == 0
    msgs += [{"role": "assistant", "content": a.text}, {"role": "user", "content": "more please"}]
    b = m.chat(msgs, max_tokens=12, temperature=0, reuse_kv=True)
    assert b.stats["prompt_reused"] >= a.stats["prompt_tokens"] - 2
    assert b.stats["prompt_tokens"] == b.stats["prompt_total"]
    assert b.tokens == fresh.chat(msgs, max_tokens=12, temperature=0).tokens
    # Another generation took the KV cache since: nothing is kept, the tokens are the same.
    m.generate("something else", max_tokens=2)
    c = m.chat(msgs, max_tokens=12, temperature=0, reuse_kv=True)
    assert c.stats["prompt_reused"] == 0 and c.tokens == b.tokens
    # Without reuse_kv, the whole prompt runs.
    d = m.chat(msgs, max_tokens=12, temperature=0)
    assert d.stats["prompt_reused"] == 0 and d.tokens == b.tokens
