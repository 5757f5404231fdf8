"""An audited app's model calls that bypass LangChain, answered by the gateway; the rest of its
traffic refused or recorded.

`biaslab.agents.app_models` catches every LangChain chat-model call. Apps also call models
without LangChain: the OpenAI SDK (``OpenAI(...).chat.completions.create``, streaming, the
Responses API, sync and async), or a plain POST of a chat completions body with ``httpx`` or
``requests``. All of these end in one of a few methods, which are replaced while a cell runs:

- ``HTTPTransport.handle_request`` and ``AsyncHTTPTransport.handle_async_request`` of
  ``httpx`` and of its fork ``httpx2`` (the OpenAI SDK sends through one of them, so this
  covers the SDK and raw httpx alike);
- ``requests.adapters.HTTPAdapter.send``.

A POST from the app's code to a path ending ``/chat/completions`` or ``/responses`` is a model
call: it is read (`biaslab.agents.app_openai_wire`), attributed to the node LangGraph runs it
in (its run config, which follows the call through tasks and, with
`biaslab.agents.app_threads`, thread pools), exposed and mitigated, sent to the cell's model
for that node through the gateway (cached, recorded, replayed: `app_models.answer_call`) and
answered with the JSON, or the event stream, the endpoint would have sent. Nothing reaches the
app's endpoint, whatever its URL. Any other request goes out only to a host the spec allows
(``allow_hosts``), never in a strict replay, and is recorded (method, URL without credentials,
status, size); otherwise it is refused and the cell fails naming the node and the host.
Clients that use none of these (``urllib``, ``aiohttp``, a database driver) meet the socket
guard of `biaslab.agents.app_guard`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import threading
from typing import Any, Iterator
from urllib.parse import urlsplit

from biaslab.agents import app_guard, app_openai_wire as wire
from biaslab.agents.app_guard import (ALLOWED, OWN, CellGuard, CellRefused, HostRule,
                                      allowed_traffic, app_traffic, current_guard, who)
from biaslab.agents.app_models import AppCalls, active_calls, answer_call, node_path
from biaslab.agents.app_threads import install_pool_context, uninstall_pool_context
from biaslab.errors import ModelCallError

__all__ = ["guarding", "current_node"]

_KINDS = {"/chat/completions": "chat", "/responses": "responses"}


def current_node(calls: AppCalls) -> str:
    """The app node running now, from LangGraph's run config (which follows the code into
    tasks and, while a cell runs, thread pools)."""
    from langchain_core.runnables.config import var_child_runnable_config

    config = var_child_runnable_config.get() or {}
    return node_path(config.get("metadata"), calls.prefix)


def _step() -> Any:
    from langchain_core.runnables.config import var_child_runnable_config

    return ((var_child_runnable_config.get() or {}).get("metadata") or {}).get("langgraph_step")


def _host_port(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or {"https": 443, "http": 80}.get(parts.scheme)


def _kind(method: str, url: str) -> str | None:
    if method.upper() != "POST":
        return None
    path = urlsplit(url).path.rstrip("/")
    return next((kind for end, kind in _KINDS.items() if path.endswith(end)), None)


# -- answering a model call -----------------------------------------------------------------------


async def _answer(calls: AppCalls, guard: CellGuard, kind: str, body: bytes,
                  client: str) -> tuple[int, str, bytes]:
    """(status, content type, body) for a model call the app sent over HTTP."""
    node = current_node(calls)
    if guard.call_error is not None:  # a client retrying a failed call: fail at once
        raise guard.call_error
    try:
        if kind == "chat":
            messages, request, stream = wire.chat_request(body)
        else:
            messages, request, stream = wire.responses_request(body)
    except wire.BadRequest as exc:
        guard.fail(f"app node '{node}' sent a {kind} request biaslab cannot read as a model "
                   f"call: {exc}")
        return 400, "application/json", json.dumps(wire.error_body(str(exc))).encode()
    try:
        answer = await answer_call(calls, node, _step(), messages, request, f"app:{client}")
    except BaseException as exc:
        if guard.call_error is None and isinstance(exc, Exception):
            guard.call_error = exc
        raise
    if kind == "chat":
        if stream:
            return 200, "text/event-stream", wire.chat_stream(answer)
        return 200, "application/json", json.dumps(wire.chat_completion(answer)).encode()
    if stream:
        return 200, "text/event-stream", wire.response_stream(answer)
    return 200, "application/json", json.dumps(wire.response_object(answer)).encode()


def _answer_sync(calls: AppCalls, guard: CellGuard, kind: str, body: bytes,
                 client: str) -> tuple[int, str, bytes]:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is calls.loop:
        line = (f"a sync {client} model call inside async app node '{current_node(calls)}' "
                "would block the event loop the call needs; use the async client there")
        guard.fail(line)
        raise ModelCallError(line, status=400)
    return asyncio.run_coroutine_threadsafe(_answer(calls, guard, kind, body, client),
                                            calls.loop).result()


def _judge(method: str, url: str) -> tuple[str, AppCalls | None, CellGuard | None]:
    """What to do with a request: ``pass`` (biaslab's own, or judged already), ``route``
    (a model call of the app), ``allow`` (to an allowed host) or ``refuse``."""
    if who() in (OWN, ALLOWED):
        return "pass", None, None
    guard, calls = current_guard(), active_calls()
    if _kind(method, url) is not None and guard is not None and calls is not None:
        return "route", calls, guard
    if guard is not None and guard.allows(*_host_port(url)):
        return "allow", calls, guard
    return "refuse", calls, guard


def _refusal(guard: CellGuard | None, method: str, url: str) -> app_guard.EgressRefused:
    host, port = _host_port(url)
    what = f"an HTTP {method} ({'a model call' if _kind(method, url) else 'not a model call'})"
    if guard is None:
        return app_guard.unowned_refusal(host, port, what)
    return guard.refuse(host, port, what)


# -- httpx (and its fork httpx2, which recent OpenAI SDKs send through) --------------------------

_ORIGINAL: dict[str, Any] = {}
_HTTPX = ("httpx", "httpx2")


def _size(headers) -> int | None:
    length = headers.get("content-length")
    return int(length) if length and str(length).isdigit() else None


def _client(request, lib) -> str:
    """The client that sent `request`, for the record: the OpenAI SDK says so in its
    user agent; anything else is the HTTP library itself."""
    agent = request.headers.get("user-agent", "")
    return "openai-sdk" if agent.startswith(("OpenAI/", "AsyncOpenAI/")) else lib.__name__


def _httpx_patches(lib):
    """The two transport methods for one httpx-like module `lib`, closing over its originals."""
    sync_original = lib.HTTPTransport.handle_request
    async_original = lib.AsyncHTTPTransport.handle_async_request

    def answered(request, status: int, ctype: str, body: bytes):
        return lib.Response(status, headers={"content-type": ctype}, content=body,
                            request=request)

    def handle_request(self, request):
        url = str(request.url)
        verdict, calls, guard = _judge(request.method, url)
        if verdict == "pass":
            return sync_original(self, request)
        if verdict == "route":
            return answered(request, *_answer_sync(calls, guard, _kind(request.method, url),
                                                   request.read(), _client(request, lib)))
        if verdict == "allow":
            with allowed_traffic():
                response = sync_original(self, request)
            guard.record(request.method, url, response.status_code, _size(response.headers))
            return response
        raise lib.ConnectError(str(_refusal(guard, request.method, url)), request=request)

    async def handle_async_request(self, request):
        url = str(request.url)
        verdict, calls, guard = _judge(request.method, url)
        if verdict == "pass":
            return await async_original(self, request)
        if verdict == "route":
            body = await request.aread()
            return answered(request, *await _answer(calls, guard, _kind(request.method, url),
                                                    body, _client(request, lib)))
        if verdict == "allow":
            with allowed_traffic():
                response = await async_original(self, request)
            guard.record(request.method, url, response.status_code, _size(response.headers))
            return response
        raise lib.ConnectError(str(_refusal(guard, request.method, url)), request=request)

    return (sync_original, async_original), (handle_request, handle_async_request)


# -- requests -------------------------------------------------------------------------------------


def _requests_send(self, request, *args, **kwargs):
    import requests

    verdict, calls, guard = _judge(request.method or "GET", request.url or "")
    if verdict == "pass":
        return _ORIGINAL["requests"](self, request, *args, **kwargs)
    if verdict == "route":
        body = request.body.encode() if isinstance(request.body, str) else request.body
        status, ctype, content = _answer_sync(calls, guard, _kind(request.method, request.url),
                                              body or b"", "requests")
        response = requests.Response()
        response.status_code, response.reason = status, "OK" if status == 200 else "Bad Request"
        response.headers["Content-Type"] = ctype
        response._content, response._content_consumed = content, True
        response.encoding, response.url, response.request = "utf-8", request.url, request
        response.connection = self
        return response
    if verdict == "allow":
        with allowed_traffic():
            response = _ORIGINAL["requests"](self, request, *args, **kwargs)
        guard.record(request.method, request.url, response.status_code,
                     _size(response.headers))
        return response
    raise requests.exceptions.ConnectionError(
        str(_refusal(guard, request.method or "GET", request.url or "")), request=request)


# -- installing -----------------------------------------------------------------------------------

_LOCK = threading.Lock()
_USERS = 0


def _install() -> None:
    global _USERS
    with _LOCK:
        if _USERS == 0:
            for name in _HTTPX:
                try:
                    lib = importlib.import_module(name)
                except ImportError:
                    continue
                _ORIGINAL[name], (sync_patch, async_patch) = _httpx_patches(lib)
                lib.HTTPTransport.handle_request = sync_patch
                lib.AsyncHTTPTransport.handle_async_request = async_patch
            with contextlib.suppress(ImportError):
                from requests.adapters import HTTPAdapter

                _ORIGINAL["requests"] = HTTPAdapter.send
                HTTPAdapter.send = _requests_send
            app_guard.install_socket_guard()
            install_pool_context()
        _USERS += 1


def _uninstall() -> None:
    global _USERS
    with _LOCK:
        _USERS -= 1
        if _USERS == 0:
            for name in _HTTPX:
                if name in _ORIGINAL:
                    lib = importlib.import_module(name)
                    (lib.HTTPTransport.handle_request,
                     lib.AsyncHTTPTransport.handle_async_request) = _ORIGINAL[name]
            if "requests" in _ORIGINAL:
                from requests.adapters import HTTPAdapter

                HTTPAdapter.send = _ORIGINAL["requests"]
            _ORIGINAL.clear()
            uninstall_pool_context()
            app_guard.uninstall_socket_guard()


@contextlib.contextmanager
def guarding(calls: AppCalls, allow: tuple[HostRule, ...] = (), *,
             strict: bool = False) -> Iterator[CellGuard]:
    """Run the block as the app's code in `calls`' cell: its HTTP model calls answered by the
    gateway, its other connections allowed (and recorded) or refused. On leaving, a refusal or
    a failed model call the app may have swallowed or wrapped becomes the cell's error."""
    guard = CellGuard(allow=allow, strict=strict, node_of=lambda: current_node(calls))
    _install()
    try:
        with app_traffic(guard):
            try:
                yield guard
            except Exception as exc:
                _raise_for(guard, exc)
                raise
    finally:
        _uninstall()
    _raise_for(guard, None)


def _raise_for(guard: CellGuard, cause: BaseException | None) -> None:
    if guard.call_error is not None and guard.call_error is not cause:
        raise guard.call_error from cause
    failure = guard.failure()
    if failure is not None:
        raise CellRefused(failure, status=403) from cause

