"""`strata serve`: an OpenAI-compatible HTTP server over one loaded Model (Starlette on uvicorn).

    server = Server(strata.Model("model.gguf"), port=8080, parallel=4)
    server.run()            # until Ctrl-C or SIGTERM (main thread)
    # or: server.start() on a thread, server.url, ..., server.stop()

Requests are sequences of one Engine thread that owns the Model (engine.py); the routes and the
OpenAI schema are app.py and api.py."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

from strata._options import log_level_from_env
from strata.serve.app import Service
from strata.serve.engine import Engine

__all__ = ["Engine", "Server", "is_loopback", "listen"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (0: a free port); OSError says why not."""
    info = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = info[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, whose Ctrl-C / SIGTERM also ends every request in flight at once (each gets a
    503 or an error chunk, so the graceful wait is short) and is remembered, not raised again."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine
        self.signal: int | None = None
        self.loop: Any = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        import asyncio

        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True
        if self.signal is None:
            self.signal = sig
        if self.loop is not None:  # runs on the loop, not inside the signal handler
            name = signal.Signals(sig).name
            self.loop.call_soon_threadsafe(self.engine.shutdown, f"the server is stopping ({name})", 0.0)


class Server:
    """The engine, the app and uvicorn for one Model. `sock`: a listening socket to serve on
    (else host:port is bound here, raising OSError when it cannot be)."""

    def __init__(self, model: Any, host: str = "127.0.0.1", port: int = 8080, parallel: int = 1,
                 queue: int = 64, turn: int = 16, api_key: str | None = None, model_id: str | None = None,
                 sock: socket.socket | None = None) -> None:
        self.model = model
        self.engine = Engine(model, parallel=parallel, max_queue=queue, turn=turn)
        self.model_id = model_id or os.path.basename(model.path)
        level = log_level_from_env()
        self.service = Service(self.engine, self.model_id, api_key or None, debug=level == "debug")
        self.sock = sock if sock is not None else listen(host, port)
        self.host = host
        self.port: int = self.sock.getsockname()[1]
        verbose = level in ("info", "debug")  # uvicorn's startup lines and one line per request
        config = uvicorn.Config(self.service.app(), lifespan="off", log_level="info" if verbose else "warning",
                                access_log=verbose, timeout_graceful_shutdown=0.5,  # type: ignore[arg-type]
                                server_header=False)
        self._uv = _Uvicorn(config, self.engine)
        self._thread: threading.Thread | None = None
        # After run(): False when a prompt chunk was still running in the native model (not waited for).
        self.engine_stopped = True

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def run(self) -> int | None:
        """Serves until Ctrl-C or SIGTERM (on the main thread) or stop(); returns the signal that
        stopped it, or None. Connections get half a second to finish (every request in flight has
        been answered with an error by then), the step in progress a third of a second."""
        self.engine.start()
        try:
            self._uv.run(sockets=[self.sock])
        finally:
            self.engine_stopped = self.engine.shutdown("the server has stopped", wait=0.3)
            self.sock.close()
        return self._uv.signal

    def start(self, timeout: float = 10.0) -> Server:
        """Serves on a thread (no signal handling); returns when it accepts requests."""
        self._thread = threading.Thread(target=self.run, name="strata-serve", daemon=True)
        self._thread.start()
        t0 = time.monotonic()
        while not self._uv.started:
            if not self._thread.is_alive() or time.monotonic() - t0 > timeout:
                raise RuntimeError("strata serve did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ends a start()ed server: requests in flight get 503, then the thread joins."""
        if self._uv.loop is not None:
            self._uv.loop.call_soon_threadsafe(self.engine.shutdown, "the server is stopping", 0.0)
        self._uv.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
