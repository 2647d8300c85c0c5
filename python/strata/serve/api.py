"""The OpenAI schema at the edge: request bodies checked field by field into what the engine runs
(ApiError, in OpenAI's error shape, for anything else), and the response and chunk objects."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strata import _core
from strata.chat import DEFAULT_CHAT_TEMPLATE, render_chat
from strata.model import GENERATE_DEFAULTS, sampling_params

# Roles the chat template is given as they are; "developer" (OpenAI's newer name) is rendered as system.
ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 16


class ApiError(Exception):
    """A request the server refuses: HTTP status and OpenAI's {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, else a 400 saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise bad("the request body is not UTF-8 text") from None
    except (ValueError, RecursionError) as e:
        raise bad(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


# ---- fields ----

def _int(body: dict[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"'{key}' must be an integer, got {json.dumps(v)[:40]}", key)
    if not lo <= v <= hi:
        raise bad(f"'{key}' must be in [{lo}, {hi}], got {v}", key)
    return v


def _num(body: dict[str, Any], key: str, lo: float, hi: float, default: float, lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"'{key}' must be a number, got {json.dumps(v)[:40]}", key)
    if v > hi or v < lo or (lo_open and v == lo):
        raise bad(f"'{key}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}", key)
    return float(v)


def _bool(body: dict[str, Any], key: str) -> bool:
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be true or false, got {json.dumps(v)[:40]}", key)
    return v


def _stops(body: dict[str, Any]) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise bad(f"'stop' takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    return [s for s in stops if s]  # an empty stop string stops nothing (as OpenAI's API takes it)


def _unsupported(body: dict[str, Any]) -> None:
    """Fields strata serve does not do, refused unless they ask for the default."""
    n = _int(body, "n", 1, 128, 1)
    if n != 1:
        raise bad(f"'n' must be 1: strata serve makes one choice per request, got {n}", "n")
    for key in ("presence_penalty", "frequency_penalty"):
        if _num(body, key, -2.0, 2.0, 0.0) != 0.0:
            raise bad(f"'{key}' is not supported: strata's sampler has no additive penalty; use "
                      "'repeat_penalty' (llama.cpp's multiplicative repetition penalty, e.g. 1.1) and "
                      "'repeat_last_n'", key)
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise bad("'logprobs' is not supported by strata serve", "logprobs")
    if body.get("logit_bias") not in (None, {}):
        raise bad("'logit_bias' is not supported by strata serve", "logit_bias")
    if body.get("tools") not in (None, []) or body.get("functions") not in (None, []):
        raise bad("tools and function calling are not supported by strata serve", "tools")
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise bad("'response_format' other than {\"type\": \"text\"} is not supported by strata serve",
                  "response_format")
    if body.get("echo") not in (None, False):
        raise bad("'echo' is not supported by strata serve", "echo")
    if body.get("suffix") not in (None, ""):
        raise bad("'suffix' (insertion) is not supported by strata serve", "suffix")
    if _int(body, "best_of", 1, 128, 1) != 1:
        raise bad("'best_of' must be 1 in strata serve", "best_of")


@dataclass
class Parsed:
    """A checked request: the prompt's token ids and what the engine runs them with."""

    ids: list[int]
    params: _core.GenParams
    stops: list[str]
    stream: bool
    include_usage: bool
    seed: int | None


def _sampling(body: dict[str, Any], max_tokens: int) -> tuple[_core.GenParams, int | None]:
    """GenParams from OpenAI's fields and llama.cpp's extensions (top_k, min_p, repeat_penalty,
    repeat_last_n); unset ones take strata's defaults (strata.GENERATE_DEFAULTS)."""
    d = GENERATE_DEFAULTS
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -1 <= seed < 2**64):
        raise bad(f"'seed' must be an integer in [0, 2^64 - 1] (-1: random), got {json.dumps(seed)[:40]}", "seed")
    kw = dict(
        max_tokens=max_tokens,
        temperature=_num(body, "temperature", 0.0, 2.0, d["temperature"]),
        top_p=_num(body, "top_p", 0.0, 1.0, d["top_p"], lo_open=True),
        top_k=_int(body, "top_k", 0, 2**31 - 1, d["top_k"]),
        min_p=_num(body, "min_p", 0.0, 1.0, d["min_p"]),
        repetition_penalty=_num(body, "repeat_penalty", 0.0, 100.0, d["repetition_penalty"], lo_open=True),
        repeat_last_n=_int(body, "repeat_last_n", -1, 2**31 - 1, d["repeat_last_n"]),
        seed=seed,
    )
    try:
        return sampling_params(**kw), seed
    except _core.ConfigError as e:  # the native ranges, should a field pass ours and not theirs
        raise bad(str(e)) from None


def _max_tokens(body: dict[str, Any], default: int) -> int:
    a = _int(body, "max_completion_tokens", 0, 2**62)
    b = _int(body, "max_tokens", 0, 2**62)
    if a is not None and b is not None and a != b:
        raise bad("'max_tokens' and 'max_completion_tokens' differ: give one", "max_tokens")
    return a if a is not None else b if b is not None else default


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    if not stream:
        raise bad("'stream_options' is only allowed with 'stream': true", "stream_options")
    return _bool(so, "include_usage")


def _check_length(ids: list[int], model: Any, param: str) -> None:
    """A prompt fits a slot: the model's KV region (ctx divided among its seqs) less one token."""
    if not ids:
        raise bad("the prompt is empty: it must hold at least one token", param)
    ctx, seqs = model.seq_ctx, model.seqs
    if len(ids) >= ctx:
        where = (" (strata serve -c/--ctx)" if seqs == 1 else
                 f" a slot (strata serve -c/--ctx {model.ctx} divided among --parallel {seqs})")
        fix = "" if seqs == 1 else " or a smaller --parallel"
        raise bad(f"the prompt has {len(ids)} tokens but the context is {ctx} tokens{where}: "
                  f"a prompt may have at most {ctx - 1}, leaving room for the reply; shorten it or restart the "
                  f"server with a larger -c{fix}", param, "context_length_exceeded")


def _content(m: dict[str, Any], i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        out = []
        for k, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"messages[{i}].content[{k}]: only text parts are supported, got {kind!r}",
                          f"messages[{i}].content")
            out.append(part["text"])
        return "".join(out)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def messages_of(body: dict[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if msgs is None:
        raise bad("'messages' is required: a list of {role, content} objects", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        role = m.get("role")
        if role in ("tool", "function") or m.get("tool_calls"):
            raise bad(f"messages[{i}]: tool messages and tool calls are not supported by strata serve",
                      f"messages[{i}].role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role {json.dumps(role)[:40]} is not one of {', '.join(ROLES)}",
                      f"messages[{i}].role")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    return out


def parse_chat(body: dict[str, Any], model: Any) -> Parsed:
    """A /v1/chat/completions body: the messages through the model's chat template (as
    Model.chat), then tokenized as it does."""
    msgs = messages_of(body)
    _unsupported(body)
    stream = _bool(body, "stream")
    include_usage = _stream_options(body, stream)
    stops = _stops(body)
    try:
        prompt = render_chat(model.chat_template or DEFAULT_CHAT_TEMPLATE, msgs, add_generation_prompt=True,
                             bos_token=model.tokenizer.bos_token, eos_token=model.tokenizer.eos_token)
    except _core.Error as e:  # the template's own refusal (e.g. roles that must alternate)
        raise bad(str(e), "messages") from None
    ids = model.tokenize(prompt, add_special=False)
    _check_length(ids, model, "messages")
    params, seed = _sampling(body, _max_tokens(body, model.seq_ctx))
    params.stop_ids = [] if _bool(body, "ignore_eos") else sorted(model.tokenizer.stop_ids)
    return Parsed(ids, params, stops, stream, include_usage, seed)


def parse_completion(body: dict[str, Any], model: Any) -> Parsed:
    """A /v1/completions body: one prompt (text or token ids), tokenized as Model.generate does."""
    if "prompt" not in body:
        raise bad("'prompt' is required: a string or a list of token ids", "prompt")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    V = model.spec["vocab"]
    if isinstance(p, str):
        ids = model.tokenize(p, add_special=True)
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        bad_ids = [t for t in p if not 0 <= t < V]
        if bad_ids:
            raise bad(f"'prompt' token id {bad_ids[0]} is out of range [0, {V})", "prompt")
        ids = list(p)
    elif isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        raise bad(f"'prompt' holds {len(p)} prompts: strata serve takes one per request", "prompt")
    else:
        raise bad("'prompt' must be a string or a non-empty list of token ids", "prompt")
    _unsupported(body)
    stream = _bool(body, "stream")
    include_usage = _stream_options(body, stream)
    stops = _stops(body)
    _check_length(ids, model, "prompt")
    params, seed = _sampling(body, _max_tokens(body, 16))  # OpenAI's default for completions
    params.stop_ids = [] if _bool(body, "ignore_eos") else sorted(model.tokenizer.stop_ids)
    return Parsed(ids, params, stops, stream, include_usage, seed)


# ---- responses ----

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(stats: dict[str, Any]) -> dict[str, Any]:
    p, c = stats["prompt_tokens"], stats["completion_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": stats["prompt_reused"]}}


def timings(stats: dict[str, Any]) -> dict[str, Any]:
    """strata's own per-request numbers (an extra field, as llama-server's "timings")."""
    keys = ("prompt_reused", "recomputed", "queue_ms", "prompt_ms", "decode_ms", "total_ms")
    return {k: stats[k] for k in keys}


def chat_response(rid: str, model_id: str, text: str, finish: str, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model_id,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                     "logprobs": None}],
        "usage": usage(stats), "strata": timings(stats),
    }


def completion_response(rid: str, model_id: str, text: str, finish: str, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model_id,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        "usage": usage(stats), "strata": timings(stats),
    }


def chat_chunk(rid: str, model_id: str, created: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_id,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def completion_chunk(rid: str, model_id: str, created: int, text: str, finish: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": model_id,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}


def usage_chunk(kind: str, rid: str, model_id: str, created: int, stats: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream with stream_options.include_usage: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model_id, "choices": [],
            "usage": usage(stats), "strata": timings(stats)}


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def model_ids(names: Sequence[str]) -> list[dict[str, Any]]:
    return [{"id": n, "object": "model", "created": 0, "owned_by": "strata"} for n in names]
