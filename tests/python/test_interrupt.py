"""Ctrl-C: a prompt stops within a second (between layers and inside a layer's ops), the Model stays
usable, the stats so far are kept; the CLI prints a note and the --stats asked for and exits 130;
a progress line shows for long prompts on a terminal only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import strata
import strata.model
from strata.testing import make_qwen3moe

pexpect = pytest.importorskip("pexpect")

PYTHON_DIR = os.path.dirname(os.path.dirname(strata.__file__))


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> str:
    """A model whose 4000-token prompt takes seconds on the CPU (~10 s on 2 cores)."""
    path = str(tmp_path_factory.mktemp("interrupt") / "slow.gguf")
    make_qwen3moe(path, layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=16, top_k=4,
                  expert_ffn=256, vocab=1024, quant={"experts": "Q8_0"}, seed=3)
    return path


def long_ids(n: int = 4000) -> list[int]:
    return np.random.default_rng(0).integers(1, 900, n).tolist()


class SigintOnProgress:
    """Stands in for the prompt's progress line: once the prompt runs, a timer sends SIGINT after
    `delay` seconds (long enough to land inside a layer's ops) and notes when."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.sent_at: float | None = None
        self.timer: threading.Timer | None = None

    def _send(self) -> None:
        self.sent_at = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    def __call__(self, done: float, total: int) -> None:
        if self.timer is None:
            self.timer = threading.Timer(self.delay, self._send)
            self.timer.start()

    def close(self) -> None:
        pass


class Quiet:
    def __call__(self, done: float, total: int) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def sigint_on_progress(monkeypatch):
    """The next prompt's progress (and only its) sends SIGINT `delay` seconds after it starts."""
    made: list[SigintOnProgress] = []

    def arm(delay: float = 0.3) -> list[SigintOnProgress]:
        def factory() -> SigintOnProgress | Quiet:
            if made:
                return Quiet()
            made.append(SigintOnProgress(delay))
            return made[-1]
        monkeypatch.setattr(strata.model, "PromptProgress", factory)
        monkeypatch.setattr(strata.Model, "_shows_progress", lambda self: True)
        return made
    yield arm
    for p in made:
        if p.timer is not None:
            p.timer.join()


@pytest.mark.parametrize("load", [
    dict(expert_cache="all", prefill=4096),  # one long chunk: the signal lands inside a layer's ops
    # streamed, slots lent to the chunk: it borrows 46 of the 50 slots, the experts (64 slots' worth) thrash
    dict(expert_cache="10MiB", prefill=512, source="mmap"),
])
def test_prompt_stops_within_a_second_and_the_model_stays_usable(slow_model, sigint_on_progress, load):
    m = strata.Model(slow_model, ctx=4096, progress=False, **load)
    made = sigint_on_progress(0.3)
    with pytest.raises(KeyboardInterrupt):
        m.generate(long_ids(), max_tokens=4)
    stopped = time.monotonic()
    assert made[0].sent_at is not None and stopped - made[0].sent_at < 1.0
    st = m.last_stats
    assert st["stop_reason"] == "interrupted" and st["prompt_total"] == 4000
    assert 0 <= st["prompt_tokens"] < 4000 and st["generated"] == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # The next generation and logits are those of a model that was never interrupted.
    fresh = strata.Model(slow_model, ctx=4096, progress=False, **load)
    ids = long_ids(40)
    a = m.generate(ids, max_tokens=6, temperature=0)
    b = fresh.generate(ids, max_tokens=6, temperature=0)
    assert a.tokens == b.tokens and a.stats["stop_reason"] == "max_tokens"
    assert np.array_equal(m.logits(ids[:9]), fresh.logits(ids[:9]))


def test_logits_stop_too(slow_model, monkeypatch):
    m = strata.Model(slow_model, ctx=4096, progress=False, prefill=4096)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        m.logits(long_ids())
    timer.join()
    assert time.monotonic() - t0 < 1.5
    assert m.logits([1, 2, 3]).shape == (3, 1024)


def test_decode_stops_with_its_stats(slow_model):
    """Ctrl-C between tokens or inside one: the stream ends as interrupted, with the tokens so far."""
    m = strata.Model(slow_model, ctx=4096, progress=False)
    # ignore_eos: greedy decoding of this model ends at a stop token after 58 tokens in ~50 ms, a race
    # with the timer below that a fast machine loses.
    it = m.generate(long_ids(8), max_tokens=4000, temperature=0, stream=True, ignore_eos=True)
    n = 0
    with pytest.raises(KeyboardInterrupt):
        for _ in it:
            n += 1
            if n == 5:
                threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
    strata.model.stop_stream(it)  # a Ctrl-C that landed in this loop, not in the model
    st = m.last_stats
    assert st["stop_reason"] == "interrupted" and 5 <= st["generated"] < 4000
    assert m.generate(long_ids(8), max_tokens=3, temperature=0).stats["generated"] == 3


def test_a_custom_sigint_handler_is_left_alone(slow_model):
    """With the program's own SIGINT handler in place, strata does not take Ctrl-C: the handler runs
    once the call returns, and the prompt completes."""
    m = strata.Model(slow_model, ctx=4096, progress=False)
    seen = []
    old = signal.signal(signal.SIGINT, lambda *a: seen.append(time.monotonic()))
    try:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        out = m.generate(long_ids(600), max_tokens=2, temperature=0)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, old)
    assert seen and out.stats["prompt_tokens"] == 600 and out.stats["stop_reason"] == "max_tokens"


def test_a_stopped_load_frees_what_it_allocated(slow_model, monkeypatch):
    """Ctrl-C while the host copy of the experts is made: KeyboardInterrupt, nothing left allocated."""
    class SigintOnFirstLayer:
        def __init__(self, label: str) -> None:
            pass

        def __call__(self, done: int, total: int) -> None:
            os.kill(os.getpid(), signal.SIGINT)

        def close(self) -> None:
            pass

    monkeypatch.setattr(strata.model, "ProgressBar", SigintOnFirstLayer)
    monkeypatch.setattr(strata.Model, "_shows_progress", lambda self: True)
    be = strata.Backend("cpu", 1)
    base = be.live_allocations()
    with pytest.raises(KeyboardInterrupt):
        strata.Model(slow_model, expert_cache="5MiB", prefill=256, source="host", backend=be)
    assert be.live_allocations() == base


# ---- the CLI ----

def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("STRATA_LOG", None)
    env["COLUMNS"] = "200"
    return env


def _prompt_file(tmp_path, words: int = 800) -> str:
    p = tmp_path / "long.txt"
    p.write_text(" ".join(f"word{i % 50}" for i in range(words)))
    return str(p)


PROGRESS = re.compile(r"prompt \d+/\d+ tokens, [\d.]+ tok/s, ETA")


def test_cli_ctrl_c_in_a_long_prompt(slow_model, tmp_path):
    """On a terminal: a progress line while the prompt runs; Ctrl-C stops it within a second with a
    note and the --stats asked for, exit 130. The prompt (15,360 tokens in four chunks: ~1.5 s a chunk on
    two cores of 2026) outlasts the first progress line by seconds, whatever the machine's speed: 3,840
    tokens in one chunk could end before the interrupt arrived."""
    c = pexpect.spawn(sys.executable, ["-m", "strata.cli", "generate", slow_model, "-f",
                                       _prompt_file(tmp_path, 3200), "-c", "16384", "--prefill", "4096", "--stats"],
                      env=_env(), encoding="utf-8", timeout=120, dimensions=(24, 200))
    c.expect(PROGRESS)
    c.sendintr()
    t0 = time.monotonic()
    c.expect(r"strata: interrupted during the prompt, after \d+ of its \d+ tokens")
    assert time.monotonic() - t0 < 1.0
    c.expect("stop: interrupted")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 130
    assert "Traceback" not in c.before


def test_cli_quiet_shows_no_progress(slow_model, tmp_path):
    """--quiet: no progress line even on a terminal; Ctrl-C still prints the --stats."""
    c = pexpect.spawn(sys.executable, ["-m", "strata.cli", "generate", slow_model, "-f", _prompt_file(tmp_path),
                                       "-c", "8192", "-n", "4000", "--prefill", "4096", "--quiet", "--stats",
                                       "--ignore-eos"],  # no early end: sampling is unseeded
                      # the interrupt may land inside a character of the random reply
                      env=_env(), encoding="utf-8", codec_errors="replace", timeout=120, dimensions=(24, 200))
    time.sleep(4)  # imports, load, tokenizing, the prompt (seconds), some of the 4000 tokens
    c.sendintr()
    c.expect("strata: interrupted")  # in the prompt or the reply: the stats asked for follow
    c.expect("stop: interrupted")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 130
    assert not PROGRESS.search(c.before or "")


def test_cli_sigint_to_bench_without_a_terminal(slow_model):
    """SIGINT to a `strata bench` in a pipeline: no progress line (stderr is no terminal), a note, 130."""
    p = subprocess.Popen([sys.executable, "-m", "strata.cli", "bench", slow_model, "--prompt-tokens", "3000",
                          "--gen-tokens", "4000", "--prefill", "4096"], env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(4)  # in the prompt or the decode: either stops
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 1.5
    assert p.returncode == 130, err
    assert "strata: interrupted" in err and "Traceback" not in err
    assert not PROGRESS.search(err)


def test_ctrl_c_stops_a_batch_and_the_model_stays_usable(slow_model):
    """Ctrl-C while four sequences decode together (Model.generate_batch): KeyboardInterrupt within a
    second, and the model then gives a fresh model's tokens."""
    kw = dict(temperature=0, ignore_eos=True)
    m = strata.Model(slow_model, progress=False, ctx=4 * 1024, seqs=4)
    prompts = [long_ids(40 + 10 * i) for i in range(4)]
    sent: list[float] = []

    def send() -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(0.5, send)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            m.generate_batch(prompts, max_tokens=900, **kw)
        stopped = time.monotonic()
    finally:
        timer.cancel()
    assert sent and stopped - sent[0] < 1.0
    fresh = strata.Model(slow_model, progress=False, ctx=4 * 1024, seqs=4)
    again = [c.tokens for c in m.generate_batch(prompts, max_tokens=6, **kw)]
    assert again == [c.tokens for c in fresh.generate_batch(prompts, max_tokens=6, **kw)]


# A child in which SIGINT arrives while `strata` is being imported (a finder on sys.meta_path sends it when
# the import of the package begins), then runs the `strata` command's entry point (or, `direct`, strata.cli's).
_IMPORT_INTERRUPTED = """
import os, signal, sys
class SigintOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "strata":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, SigintOnImport())
sys.argv = ["strata", "--version"]
if {direct}:
    from strata.cli import main
else:
    from _strata_cli import main
main()
"""


def test_ctrl_c_while_the_command_imports_is_one_line():
    """The `strata` entry point (_strata_cli): Ctrl-C during the package's imports (~0.2 s, before strata.cli
    can catch it) ends with strata's line and 130, not Python's traceback, which strata.cli alone gives."""
    run = [sys.executable, "-c", _IMPORT_INTERRUPTED.format(direct=False)]
    p = subprocess.run(run, env=_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 130 and p.stderr.strip() == "strata: interrupted" and not p.stdout, p.stderr
    bare = subprocess.run([sys.executable, "-c", _IMPORT_INTERRUPTED.format(direct=True)], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" in bare.stderr and "KeyboardInterrupt" in bare.stderr
    # After the imports SIGINT is Python's again (strata.cli turns KeyboardInterrupt into the same line).
    after = subprocess.run([sys.executable, "-c", "import signal, sys; sys.argv = ['strata', '--version']\n"
                            "from _strata_cli import main\n"
                            "import strata.cli; strata.cli.main = lambda: print(signal.getsignal(signal.SIGINT)"
                            " is signal.default_int_handler)\nmain()"],
                           env=_env(), capture_output=True, text=True, timeout=60)
    assert after.stdout.strip() == "True", after.stderr
