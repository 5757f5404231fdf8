"""What the viewer does so that only the browser tab the user opened can read a run's traces.

Binding to 127.0.0.1 keeps other machines out, but not a web page in the user's own browser:
a page on ``evil.example`` can make its name resolve to 127.0.0.1 (DNS rebinding) and then read
``/api/...`` as same-origin. Its requests still carry ``Host: evil.example:PORT``, so every
request whose Host is not the served address is refused. The security headers keep a model
output that slipped past escaping from running script, being sniffed as another type, or being
framed by another site.
"""

from __future__ import annotations

__all__ = ["allowed_hosts", "host_allowed", "security_headers", "APP_POLICY", "REPORT_POLICY"]

APP_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
              "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'")
"""The viewer page: scripts, styles and API calls from the viewer itself, nothing inline."""
REPORT_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
                 "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""report.html as the viewer serves it: its inline CSS and base64 figures, and no script."""


def allowed_hosts(bound_host: str, port: int) -> frozenset[str]:
    """The Host values that name the served address: the bound host and ``localhost`` (on
    port 80 also without the port, as browsers send them)."""
    names = {bound_host, "127.0.0.1", "localhost"}
    return frozenset({f"{name}:{port}" for name in names}
                     | (names if port == 80 else set()))


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's Host header names the served address (case-insensitive; a request
    with no Host header is refused, as no browser sends one)."""
    return bool(host_header) and host_header.strip().lower() in allowed


def security_headers(policy: str = APP_POLICY) -> list[tuple[str, str]]:
    """Headers sent on every response."""
    return [("Content-Security-Policy", policy),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "no-referrer"),
            ("Cross-Origin-Resource-Policy", "same-origin")]
