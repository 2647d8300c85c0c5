"""The HTTP face of the engine: a Starlette app with OpenAI's routes, the API key, body limits,
SSE streaming, disconnects, /health and /metrics. Every error a client can cause is a 4xx in
OpenAI's error shape; anything else is a 500 in the same shape, with one line in the server's log
and never a traceback to the client."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import Counter
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strata.serve import api
from strata.serve.api import ApiError
from strata.serve.engine import Done, Engine, Failed, Job, Piece, QueueFull, Stopped

log = logging.getLogger("strata.serve")

# Requests larger than this are refused (413) before they are parsed: room for a prompt of the whole
# context as JSON (64 bytes a token is generous even for escaped text or token ids), plus 1 MiB.
BODY_BYTES_PER_TOKEN = 64
BODY_BASE = 2**20
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


def body_limit(ctx: int) -> int:
    return BODY_BASE + BODY_BYTES_PER_TOKEN * ctx


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class _Edge:
    """Outermost ASGI layer: the API key (every route but /health), request counts by route and
    status for /metrics, and the last word on anything that escaped the app (a JSON 500)."""

    def __init__(self, app: ASGIApp, api_key: str | None, counts: Counter, debug: bool = False) -> None:
        self.app = app
        self.api_key = api_key
        self.counts = counts
        self.debug = debug

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"].rstrip("/") or "/"
        route = path if path in ENDPOINTS else ("/v1" + path if "/v1" + path in ENDPOINTS else "other")
        status = {"code": 0}

        async def counted(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
            await send(msg)

        try:
            if self.api_key and path != "/health" and not self._authorized(scope):
                await _error(ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' with "
                                           "the key strata serve was started with (--api-key)",
                                      "authentication_error", code="invalid_api_key",
                                      headers={"WWW-Authenticate": "Bearer"}))(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        except ClientDisconnect:  # the client left while sending its body: no one to answer
            pass
        except Exception as e:  # the app's handlers answer everything; this is a bug, said in one line
            log.error("internal error on %s: %s: %s", path, type(e).__name__, e)
            if self.debug:
                log.exception("the traceback (STRATA_LOG=debug)")
            if not status["code"]:
                await JSONResponse(api.error_body(f"internal error: {type(e).__name__}: {e}", "server_error"),
                                   status_code=500)(scope, receive, counted)
        finally:
            self.counts[(route, status["code"] or 499)] += 1

    def _authorized(self, scope: Scope) -> bool:
        for k, v in scope["headers"]:
            if k == b"authorization":
                scheme, _, token = v.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    return hmac.compare_digest(token.strip().encode(), self.api_key.encode())  # type: ignore[union-attr]
        return False


async def _wait_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (after the body was read, receive() waits for that)."""
    while True:
        if (await receive())["type"] == "http.disconnect":
            return


async def _next(q: asyncio.Queue, gone: asyncio.Future) -> Any:
    """The job's next event, or None when the client went away first."""
    if not q.empty():
        return q.get_nowait()
    get = asyncio.ensure_future(q.get())
    try:
        done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled with the response (the client left): leave no task behind
        get.cancel()
        raise
    if get in done:
        return get.result()
    get.cancel()
    return None


class Service:
    """The routes, over one Engine and its Model."""

    def __init__(self, engine: Engine, model_id: str, api_key: str | None = None, debug: bool = False) -> None:
        self.engine = engine
        self.debug = debug  # tracebacks of internal errors in the server's log
        self.model = engine.model
        self.model_id = model_id
        self.api_key = api_key
        self.max_body = body_limit(self.model.ctx)
        self.counts: Counter = Counter()
        self.started = time.time()

    def app(self) -> ASGIApp:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
        for prefix in ("/v1", ""):  # base URLs with and without /v1, as llama-server takes them
            routes += [
                Route(f"{prefix}/models", self.models, methods=["GET"]),
                Route(f"{prefix}/models/{{name:path}}", self.model_info, methods=["GET"]),
                Route(f"{prefix}/chat/completions", self.chat, methods=["POST"]),
                Route(f"{prefix}/completions", self.completions, methods=["POST"]),
            ]
        app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error,
                                                           ApiError: self._api_error,
                                                           Exception: self._internal_error})
        return _Edge(app, self.api_key, self.counts, self.debug)

    # ---- errors ----
    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        msg = {404: f"no route {request.method} {request.url.path}: strata serve has POST /v1/chat/completions, "
                    "POST /v1/completions, GET /v1/models, GET /health and GET /metrics",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(api.error_body(msg, kind), status_code=exc.status_code, headers=exc.headers)

    async def _api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _error(exc)

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        # Starlette raises it again after this answer: _Edge logs it.
        return JSONResponse(api.error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"),
                            status_code=500)

    # ---- plain routes ----
    async def health(self, request: Request) -> Response:
        # 503 once the engine has stopped, so that a proxy's health check takes the replica out.
        ok = self.engine.alive
        return JSONResponse({"status": "ok" if ok else "stopped", **self.engine.state()},
                            status_code=200 if ok else 503)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": self._model_list()})

    async def model_info(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name != self.model_id:
            raise ApiError(404, f"model '{name}' does not exist: this server has '{self.model_id}'",
                           "not_found_error", "model", "model_not_found")
        return JSONResponse(self._model_list()[0])

    def _model_list(self) -> list[dict[str, Any]]:
        d = api.model_ids([self.model_id])
        d[0]["created"] = int(self.started)
        return d

    async def metrics(self, request: Request) -> Response:
        # The expert cache's counters are read on the engine thread between steps; when a long step
        # (a prompt) holds it, the last reading serves.
        try:
            cache = await asyncio.wait_for(asyncio.wrap_future(self.engine.call(self._engine_counters)), 1.0)
            self.engine.counters.cache = cache
        except (asyncio.TimeoutError, Stopped):
            cache = self.engine.counters.cache
        return Response(self._metrics_text(cache), media_type="text/plain; version=0.0.4; charset=utf-8")

    def _engine_counters(self) -> dict[str, Any]:
        """The expert cache's counters and the batched passes' graph replays (on the engine thread)."""
        d = dict(self.model.cache)
        d["batch_steps_replayed"] = self.model._m.batch_steps["replayed"]
        return d

    def _metrics_text(self, cache: dict[str, Any]) -> str:
        c = self.engine.counters
        st = self.engine.state()
        out: list[str] = []

        def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP strata_{name} {help}")
            out.append(f"# TYPE strata_{name} {kind}")
            for labels, v in samples:
                out.append(f"strata_{name}{labels} {v:g}" if isinstance(v, float) else f"strata_{name}{labels} {v}")

        metric("http_requests_total", "counter", "HTTP requests answered, by route and status code.",
               [(f'{{route="{r}",code="{s}"}}', n) for (r, s), n in sorted(self.counts.items())])
        metric("requests_total", "counter", "Generation requests by outcome.",
               [('{outcome="finished"}', c.finished), ('{outcome="cancelled"}', c.cancelled),
                ('{outcome="failed"}', c.failed), ('{outcome="rejected"}', c.rejected)])
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished and cancelled requests (tokens in).",
               [("", c.prompt_tokens)])
        metric("prompt_tokens_reused_total", "counter",
               "Prompt tokens whose KV an earlier request left in the cache (not run again).", [("", c.prompt_reused)])
        metric("generated_tokens_total", "counter", "Tokens generated (tokens out).", [("", c.generated)])
        metric("recomputed_tokens_total", "counter",
               "Tokens run again because another sequence had taken their KV region.", [("", c.recomputed)])
        metric("prompt_seconds_total", "counter", "Seconds spent on prompts.", [("", c.prompt_seconds)])
        metric("decode_seconds_total", "counter", "Seconds spent on decode passes.", [("", c.decode_seconds)])
        metric("steps_total", "counter", "Engine steps run.", [("", c.steps)])
        metric("step_seconds_total", "counter",
               "Wall-clock seconds of the engine's steps (passes, sampling, detokenizing, emitting).",
               [("", c.step_seconds)])
        metric("decode_pass_seconds_total", "counter",
               "Of the steps' seconds, those in the decode passes' native calls (one a step when batched).",
               [("", c.pass_seconds)])
        metric("batched_decode_passes_total", "counter",
               "Decode passes that advanced several sequences at once (continuous batching).",
               [("", c.batched_steps)])
        metric("batched_decode_rows_total", "counter", "Sequences those passes advanced, all together.",
               [("", c.batched_rows)])
        metric("batched_decode_passes_replayed_total", "counter",
               "Of all batched decode passes, those replayed from a recorded graph (a GPU; the same sequences "
               "two steps in a row are recorded once).", [("", cache.get("batch_steps_replayed", 0))])
        metric("queue_depth", "gauge", "Requests waiting for a slot.", [("", st["queue"])])
        metric("queue_capacity", "gauge", "Requests that may wait before 429.", [("", st["queue_max"])])
        metric("slots_busy", "gauge", "Slots holding a request.", [("", st["slots_busy"])])
        metric("slots", "gauge", "Slots (--parallel).", [("", st["slots"])])
        metric("expert_cache_hits_total", "counter", "Expert lookups that found the expert resident.",
               [("", cache.get("hits", 0))])
        metric("expert_cache_misses_total", "counter", "Expert lookups that streamed the expert in.",
               [("", cache.get("misses", 0))])
        metric("expert_cache_streamed_bytes_total", "counter", "Bytes of experts streamed into the cache.",
               [("", cache.get("bytes_streamed", 0))])
        metric("expert_cache_evictions_total", "counter", "Experts evicted from the cache.",
               [("", cache.get("evictions", 0))])
        metric("expert_cache_bytes", "gauge", "Bytes of the expert cache (0: every expert resident).",
               [("", 0 if cache.get("all_resident") else cache.get("cache_bytes", 0))])
        metric("expert_cache_slots", "gauge", "Slots of the expert cache.", [("", cache.get("slots", 0))])
        return "\n".join(out) + "\n"

    # ---- generation ----
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "text")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.max_body
        too_big = ApiError(413, f"the request body is larger than {limit} bytes, the most this server takes "
                                f"(1 MiB + {BODY_BYTES_PER_TOKEN} bytes per token of its context)",
                           code="request_too_large")
        n = request.headers.get("content-length", "")
        if n.isdigit() and int(n) > limit:
            async for _ in request.stream():  # drained, not kept, so the client reads the answer
                pass
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                chunks = []
                continue
            chunks.append(chunk)
        if size > limit:
            raise too_big
        return b"".join(chunks)

    async def _generate(self, request: Request, kind: str) -> Response:
        body = api.parse_json(await self._read_body(request))
        parse = api.parse_chat if kind == "chat" else api.parse_completion
        # Templates and tokenizers take time on long prompts: off the event loop.
        p = await run_in_threadpool(parse, body, self.model)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        pieces: list[str] = []  # a whole answer's text (not streamed): kept here by the engine's thread

        def emit(ev: Any) -> None:
            if not p.stream and isinstance(ev, Piece):
                # Nothing to send before the end: no wake-up of the event loop a token (it would take the
                # GIL from the engine's thread every step). The end's event is queued after the last piece.
                pieces.append(ev.text)
                return
            try:
                loop.call_soon_threadsafe(q.put_nowait, ev)
            except RuntimeError:  # the loop has closed: the server is gone, and the client with it
                pass

        job = Job(p.ids, p.params, p.stops, emit)
        try:
            self.engine.submit(job)
        except QueueFull as e:
            raise ApiError(429, str(e), "rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except Stopped as e:
            raise ApiError(503, str(e), "server_error", code="server_shutting_down") from None
        rid = api.new_id("chatcmpl" if kind == "chat" else "cmpl")
        if p.stream:
            return StreamingResponse(self._events(request, job, q, kind, rid, p.include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        gone = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            while True:
                ev = await _next(q, gone)
                if ev is None:  # the client left: its slot is freed before the next step
                    self.engine.cancel(job)
                    return Response(status_code=499)
                if isinstance(ev, Done):
                    make = api.chat_response if kind == "chat" else api.completion_response
                    return JSONResponse(make(rid, self.model_id, "".join(pieces), ev.finish_reason, ev.stats))
                elif isinstance(ev, Failed):
                    return JSONResponse(api.error_body(ev.message, ev.type, None, ev.code), status_code=ev.status)
        finally:
            gone.cancel()
            if not job.ended:
                self.engine.cancel(job)

    async def _events(self, request: Request, job: Job, q: asyncio.Queue, kind: str, rid: str,
                      include_usage: bool) -> Any:
        """SSE: a chunk per piece as the engine makes it, the final chunk with finish_reason, the
        usage chunk when asked for, then [DONE]; an error as a chunk with "error". A client that
        goes away cancels the job."""
        created = int(time.time())
        mid = self.model_id
        gone = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            if kind == "chat":
                yield api.sse(api.chat_chunk(rid, mid, created, {"role": "assistant", "content": ""}, None))
            while True:
                ev = await _next(q, gone)
                if ev is None:
                    return
                if isinstance(ev, Piece):
                    yield api.sse(api.chat_chunk(rid, mid, created, {"content": ev.text}, None) if kind == "chat"
                                  else api.completion_chunk(rid, mid, created, ev.text, None))
                elif isinstance(ev, Done):
                    yield api.sse(api.chat_chunk(rid, mid, created, {}, ev.finish_reason) if kind == "chat"
                                  else api.completion_chunk(rid, mid, created, "", ev.finish_reason))
                    if include_usage:
                        yield api.sse(api.usage_chunk(kind, rid, mid, created, ev.stats))
                    yield api.sse("[DONE]")
                    return
                elif isinstance(ev, Failed):
                    yield api.sse(api.error_body(ev.message, ev.type, None, ev.code))
                    return
        finally:
            gone.cancel()
            if not job.ended:
                self.engine.cancel(job)
