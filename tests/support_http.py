"""A fault-injecting OpenAI-compatible chat-completions server, for tests over real HTTP.

It speaks just enough of the API for langchain-openai's ``ChatOpenAI`` and records every
request. Replies come from a per-test script first (`FakeOpenAI.queue`), then, with probability
`fault_rate`, from an injected fault, and otherwise from `responder(messages) -> content`.

Faults (`FAULTS`): ``429`` (with Retry-After), ``500``, ``503``, ``reset`` (the socket is closed
with RST after the request is read), ``truncated`` (Content-Length promises more than is sent,
then the connection drops), ``cut_json`` (a complete HTTP message whose JSON is cut short),
``empty`` (a 200 whose content is ""), ``slow`` (a correct answer after `slow_s`).

The fault for a request is drawn from an RNG seeded by (seed, request body, how many times this
body was seen), so a run meets the same faults whatever the thread and task scheduling: a test
is reproducible at any concurrency. The server binds 127.0.0.1 on a free port, with a listen
backlog large enough for 64+ concurrent connections.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import socket
import struct
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

__all__ = ["FAULTS", "FakeOpenAI", "Reply", "Seen", "synthetic_answer", "tokens",
           "loopback_only"]

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
               "all_proxy", "OPENAI_BASE_URL")


def loopback_only(monkeypatch) -> None:
    """Requests to 127.0.0.1 go straight there: no proxy, no OPENAI_BASE_URL from the shell."""
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

FAULTS = ("429", "500", "503", "reset", "truncated", "cut_json", "empty", "slow")


@dataclass
class Reply:
    """One scripted response.

    `fault` names one of `FAULTS` or any HTTP status as a string (``"400"``), and its defaults
    apply; otherwise `body` None gives a completion
    (status 200) or an error object (any other status), and a given `body` is sent as is.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | str | None = None
    fault: str | None = None


@dataclass
class Seen:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]
    fault: str | None = None
    """The fault injected into this request's reply (None: answered normally)."""
    source: str = "random"
    """Where the reply came from: ``script`` (queued), ``doom`` or ``random`` (drawn)."""


def tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen backlog: the default 5 drops connections at concurrency 64


class _Abort(Exception):
    """Raised inside a handler after it broke the connection on purpose."""


class FakeOpenAI:
    """A scriptable, fault-injecting OpenAI-compatible endpoint on 127.0.0.1.

    Args:
        fault_rate: probability that an unscripted request gets a fault.
        faults: the kinds drawn from, uniformly (default: all of `FAULTS`).
        seed: seeds the fault draws.
        retry_after: the Retry-After header sent with injected 429s.
        slow_s: the delay of a ``slow`` answer.
    """

    def __init__(self, *, fault_rate: float = 0.0, faults: tuple[str, ...] = FAULTS,
                 seed: int = 0, retry_after: str = "0", slow_s: float = 0.2):
        unknown = set(faults) - set(FAULTS)
        assert not unknown, f"unknown faults {unknown}"
        self.fault_rate, self.faults, self.seed = fault_rate, tuple(faults), seed
        self.retry_after, self.slow_s = retry_after, slow_s
        self.requests: list[Seen] = []
        self.script: deque[Reply] = deque()
        self.responder: Callable[[list[dict[str, Any]]], str] = lambda messages: "Hello there."
        self.down = False
        """While True every request is answered with a reset: the endpoint has gone away."""
        self.refused_while_down: list[bytes] = []
        """The raw bodies of requests reset because the server was down."""
        self.doom: Callable[[list[dict[str, Any]]], str | None] | None = None
        """messages -> a fault (a `FAULTS` kind or a status such as "400") injected into every
        matching request, whatever `fault_rate` says; None: no fault."""
        self._lock = threading.Lock()
        self._seen_bodies: Counter[str] = Counter()
        self._n = 0
        self._connections: set[socket.socket] = set()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def setup(self):
                super().setup()
                with fake._lock:
                    fake._connections.add(self.connection)

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except (_Abort, ConnectionError, BrokenPipeError):
                    self.close_connection = True

            def finish(self):
                with fake._lock:
                    fake._connections.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if fake.down:
                    with fake._lock:
                        fake.refused_while_down.append(raw)
                    self._reset()
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                status, headers, payload, fault = fake._handle(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                if fault == "reset":
                    self._reset()
                if fault == "slow":
                    time.sleep(fake.slow_s)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                sent = data
                if fault == "cut_json":
                    sent = data = data[: len(data) // 2]
                elif fault == "truncated":
                    sent = data[: len(data) // 2]
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(sent)
                if fault == "truncated":  # a clean FIN before the promised bytes
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    raise _Abort

            def _reset(self):
                """Drop the connection with a TCP RST, as a crashed proxy or server does."""
                try:
                    self.wfile.flush()
                except OSError:
                    pass
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.connection.close()
                raise _Abort

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)

    # -- control ---------------------------------------------------------------------------
    def queue(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop listening and drop open keep-alive connections (their threads would serve on)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        with self._lock:
            open_now = list(self._connections)
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAI":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what happened -----------------------------------------------------------------------
    def faults_injected(self) -> Counter[str]:
        return Counter(s.fault for s in self.requests if s.fault)

    def answered(self) -> list[Seen]:
        """Requests that got a usable completion (no fault, or only a slow one)."""
        return [s for s in self.requests if s.fault in (None, "slow")]

    # -- replies -----------------------------------------------------------------------------
    def _draw_fault(self, body: dict[str, Any]) -> str | None:
        """Called with the lock held."""
        if not self.fault_rate:
            return None
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        nth = self._seen_bodies[digest]
        self._seen_bodies[digest] += 1
        rng = random.Random(f"{self.seed}:{digest}:{nth}")
        return rng.choice(self.faults) if rng.random() < self.fault_rate else None

    def _handle(self, path: str, headers: dict[str, str], body: dict[str, Any]):
        with self._lock:
            self._n += 1
            n = self._n
            reply = self.script.popleft() if self.script else None
            source = "script" if reply else "random"
            doomed = self.doom(body.get("messages", [])) if self.doom and not reply else None
            if doomed:
                reply, source = Reply(fault=doomed), "doom"
            elif reply is None:
                reply = Reply(fault=self._draw_fault(body))
            self.requests.append(Seen(path, headers, body, reply.fault, source))
        if path.rstrip("/") != "/v1/chat/completions":
            return 404, {}, {"error": {"message": f"no route {path}", "type": "not_found"}}, None
        fault = reply.fault
        status = int(fault) if fault and fault.isdigit() else reply.status
        out_headers = dict(reply.headers)
        if fault == "429":
            out_headers.setdefault("Retry-After", self.retry_after)
        if reply.body is not None:
            return status, out_headers, reply.body, fault
        if status != 200:
            return status, out_headers, {"error": {
                "message": f"scripted HTTP {status}", "type": "scripted_error",
                "param": None, "code": str(status)}}, fault
        messages = body.get("messages", [])
        content = "" if fault == "empty" else self.responder(messages)
        prompt_tokens = sum(tokens(str(m.get("content", ""))) for m in messages)
        completion_tokens = tokens(content) if content else 0
        return 200, out_headers, {
            "id": f"chatcmpl-fake-{n}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "fake-model"),
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }, fault


def synthetic_answer(messages: list[dict[str, Any]]) -> str:
    """Answer like ``scripted:amplification-synthetic`` (same rules, same functions; a judge's
    answer between the verdict markers its prompt asks for)."""
    from biaslab.agents.providers.scripted import ScriptedRequest
    from biaslab.agents.verdicts import answer_in_marker
    from biaslab.graphs.amplification_synthetic import make_agent

    request = ScriptedRequest(tuple({"role": m["role"], "content": str(m["content"])}
                                    for m in messages), {}, 0)
    for rule in make_agent().rules:
        if re.search(rule.pattern, request.text, flags=re.S):
            text = rule.respond(request) if callable(rule.respond) else rule.respond
            return answer_in_marker(request.user, text)
    return "I cannot answer that."
