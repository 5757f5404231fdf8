"""Who may open a connection while an audited app's cell runs, and what was refused.

biaslab answers an app's model calls itself (`biaslab.agents.app_models`,
`biaslab.agents.app_egress`); everything else the app's code sends out of the process is an
unaudited side channel: a bill, data leaving, an answer from production landing in the audit.
So while a cell runs, each connection is judged by *who* opens it, read from a context
variable that follows the code into tasks and (with `biaslab.agents.app_threads`) thread
pools:

- biaslab's own traffic (the gateway sending a call to the model under test) is marked
  `OWN` by the gateway and passes;
- the app's code (`APP`, set for the cell) may reach only the hosts the spec allows
  (``allow_hosts``), never in a strict replay (which sends nothing anywhere), and each such
  exchange is recorded; anything else is refused and recorded as refused, so the cell fails
  naming the node and the host even if the app swallowed the error;
- code with no mark at all (a bare ``threading.Thread`` the app started, which inherits no
  context) is refused too: while a cell runs nobody else in the process opens connections.

The check sits on ``socket.socket.connect``/``connect_ex`` and ``socket.create_connection``
(the last sees host names, so ``allow_hosts`` may name a host rather than its address), which
every pure-Python client ends in. Only IPv4/IPv6 sockets are judged: a Unix socket is a local
pipe, not egress.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from biaslab.errors import ModelCallError, UserError

__all__ = ["APP", "OWN", "ALLOWED", "HostRule", "parse_allow_hosts", "CellGuard", "EgressRefused",
           "CellRefused", "judge", "unowned_refusal",
           "own_traffic", "allowed_traffic", "app_traffic", "who", "current_guard",
           "install_socket_guard", "uninstall_socket_guard"]

APP, OWN, ALLOWED = "app", "biaslab", "allowed"
_WHO: contextvars.ContextVar[str | None] = contextvars.ContextVar("biaslab_egress_who",
                                                                   default=None)
_GUARD: contextvars.ContextVar["CellGuard | None"] = contextvars.ContextVar(
    "biaslab_egress_guard", default=None)


def who() -> str | None:
    """`APP`, `OWN`, `ALLOWED`, or None (code that inherited no cell's context)."""
    return _WHO.get()


def current_guard() -> "CellGuard | None":
    return _GUARD.get()


class _marked:
    """Mark the block's traffic as `mark`: a plain class, not a generator context manager,
    because the gateway enters one on every model call (a few µs each the other way)."""

    __slots__ = ("mark", "token")

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __enter__(self) -> None:
        self.token = _WHO.set(self.mark)

    def __exit__(self, *exc: object) -> None:
        _WHO.reset(self.token)


def own_traffic():
    """Mark the block as biaslab's own traffic (the gateway calling the model under test)."""
    return _marked(OWN)


def allowed_traffic():
    """Mark the block as the app's traffic to a host the spec allows (already judged)."""
    return _marked(ALLOWED)


@contextlib.contextmanager
def app_traffic(guard: "CellGuard") -> Iterator["CellGuard"]:
    """Run the block (an app's cell) as the app: its connections are judged by `guard`."""
    token, gtoken = _WHO.set(APP), _GUARD.set(guard)
    try:
        yield guard
    finally:
        _GUARD.reset(gtoken)
        _WHO.reset(token)


@dataclass(frozen=True)
class HostRule:
    """One ``allow_hosts`` entry: a host name or address, and a port (None: any port)."""

    host: str
    port: int | None = None

    def matches(self, host: str, port: int | None) -> bool:
        return _norm(host) == self.host and (self.port is None or self.port == port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def _norm(host: str) -> str:
    host = host.strip().strip("[]").lower().rstrip(".")
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    return host


def parse_allow_hosts(value: Any) -> tuple[HostRule, ...]:
    """The spec's ``allow_hosts``: a list of ``"host"`` or ``"host:port"`` strings (IPv6 in
    brackets: ``"[::1]:9000"``). One line naming the entry for anything else."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise UserError(f"allow_hosts must be a list of \"host:port\" strings, got "
                        f"{type(value).__name__}")
    rules = []
    for entry in value:
        if not isinstance(entry, str) or not entry.strip():
            raise UserError(f"allow_hosts: {entry!r} is not a \"host\" or \"host:port\" string")
        text = entry.strip()
        if "/" in text or "@" in text or " " in text:
            raise UserError(f"allow_hosts: '{text}' must be a host or host:port, not a URL")
        host, port = text, None
        if text.startswith("["):
            inner, bracket, rest = text[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")) or not _is_ip(inner):
                raise UserError(f"allow_hosts: '{text}' is not [ipv6] or [ipv6]:port")
            host, port_text = inner, rest[1:] if rest else None
        elif text.count(":") == 1:
            host, port_text = text.split(":")
        else:
            port_text = None
        if port_text is not None:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise UserError(f"allow_hosts: '{text}' has no valid port (1-65535)")
            port = int(port_text)
        if not host or (":" in host and not _is_ip(host)):
            raise UserError(f"allow_hosts: '{text}' names no host")
        rules.append(HostRule(_norm(host), port))
    return tuple(rules)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class EgressRefused(ConnectionRefusedError):
    """An app's connection that the audit refused (an OSError, so HTTP clients report it as a
    connection failure); the cell fails with `CellGuard.failure` whatever the app made of it."""


class CellRefused(ModelCallError):
    """A cell whose app tried to reach a host it may not: the cell's error, naming the node
    and the host (raised after the app finished, whatever it made of the refusal)."""


@dataclass
class CellGuard:
    """One cell's egress policy and what its app sent or tried to.

    Attributes:
        allow: the hosts the spec allows the app to reach.
        strict: a strict replay: nothing may be sent anywhere, allowed hosts included.
        node_of: the app node running now (read from LangGraph's run config).
        traffic: the allowed exchanges: node, method, URL without credentials, status, bytes.
        refused: one line per refused connection, naming node and host.
    """

    allow: tuple[HostRule, ...] = ()
    strict: bool = False
    node_of: Callable[[], str] = lambda: "(unknown node)"
    traffic: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    call_error: BaseException | None = None
    """The first model call of the app's own client that failed for good (or missed in a
    strict replay): raised as the cell's error, since the client may have wrapped or retried
    it."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def allows(self, host: str, port: int | None) -> bool:
        return not self.strict and any(rule.matches(host, port) for rule in self.allow)

    def refuse(self, host: str, port: int | None, what: str = "a connection") -> EgressRefused:
        """Record and return the refusal of `what` to host:port by the running node."""
        where = f"{host}:{port}" if port is not None else host
        if self.strict and any(rule.matches(host, port) for rule in self.allow):
            why = "a strict replay sends nothing anywhere, allowed hosts included"
        else:
            why = "the spec does not allow it (allow_hosts)"
        line = f"app node '{self.node_of()}' opened {what} to {where}: refused, {why}"
        self.fail(line)
        return EgressRefused(line)

    def fail(self, line: str) -> None:
        """Record why the cell must fail, even if the app goes on."""
        with self._lock:
            self.refused.append(line)

    def record(self, method: str, url: str, status: int | str, size: int | None) -> None:
        from biaslab.agents.providers import strip_credentials

        with self._lock:
            self.traffic.append({"node": self.node_of(), "method": method,
                                 "url": strip_credentials(url), "status": status,
                                 "bytes": size})

    def failure(self) -> str | None:
        """The cell's error when its app tried to reach what it may not, else None."""
        if not self.refused:
            return None
        more = f" (and {len(self.refused) - 1} more)" if len(self.refused) > 1 else ""
        return self.refused[0] + more


def unowned_refusal(host: str, port: int | None, what: str) -> EgressRefused:
    """The refusal of a connection from code that belongs to no cell (it cannot fail one)."""
    where = f"{host}:{port}" if port is not None else host
    return EgressRefused(f"{what} to {where} from a thread that did not inherit an audited "
                         "cell's context (a bare threading.Thread?) while the cell runs: refused")


def judge(host: str, port: int | None, what: str = "a connection") -> None:
    """Let the connection pass, or raise `EgressRefused` (recorded on the cell's guard)."""
    mark = _WHO.get()
    if mark in (OWN, ALLOWED):
        return
    guard = _GUARD.get()
    if guard is None:
        raise unowned_refusal(host, port, what)
    if guard.allows(host, port):
        guard.record("CONNECT", f"tcp://{host}:{port}", "", None)
        return
    raise guard.refuse(host, port, what)


# -- the socket-level patch -----------------------------------------------------------------------

_LOCK = threading.Lock()
_USERS = 0
_ORIGINAL: dict[str, Any] = {}
_INET = (socket.AF_INET, socket.AF_INET6)


def _address(sock: socket.socket, address: Any) -> tuple[str, int | None] | None:
    if sock.family not in _INET or not isinstance(address, tuple) or not address:
        return None
    return str(address[0]), int(address[1]) if len(address) > 1 else None


def _connect(self, address):
    found = _address(self, address)
    if found is not None:
        judge(*found)
    return _ORIGINAL["connect"](self, address)


def _connect_ex(self, address):
    found = _address(self, address)
    if found is not None:
        judge(*found)
    return _ORIGINAL["connect_ex"](self, address)


def _create_connection(address, *args, **kwargs):
    host, port = address[0], address[1] if len(address) > 1 else None
    mark, guard = _WHO.get(), _GUARD.get()
    if mark not in (OWN, ALLOWED) and guard is not None and guard.allows(str(host), port):
        guard.record("CONNECT", f"tcp://{host}:{port}", "", None)
        with allowed_traffic():  # judged by name here: its address need not be listed
            return _ORIGINAL["create_connection"](address, *args, **kwargs)
    return _ORIGINAL["create_connection"](address, *args, **kwargs)


def install_socket_guard() -> None:
    """Judge every socket connection from now until the matching `uninstall_socket_guard`."""
    global _USERS
    with _LOCK:
        if _USERS == 0:
            _ORIGINAL.update(connect=socket.socket.connect, connect_ex=socket.socket.connect_ex,
                             create_connection=socket.create_connection)
            socket.socket.connect = _connect
            socket.socket.connect_ex = _connect_ex
            socket.create_connection = _create_connection
        _USERS += 1


def uninstall_socket_guard() -> None:
    global _USERS
    with _LOCK:
        _USERS -= 1
        if _USERS == 0:
            socket.socket.connect = _ORIGINAL["connect"]
            socket.socket.connect_ex = _ORIGINAL["connect_ex"]
            socket.create_connection = _ORIGINAL["create_connection"]
            _ORIGINAL.clear()

