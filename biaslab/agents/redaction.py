"""Credentials out of error texts, before any is stored in a run or printed.

Endpoints echo what they were sent (``Incorrect API key provided: Basic dXNlcjpw...``), and
client libraries put URLs in their messages, so an error text can hold the very secrets that
biaslab keeps off the disk. `redact` removes every form a credential takes in one:

- the secret values themselves, as the run knows them from the environment (`secrets_of`):
  the API key, the URL's password (alone and as ``user:password``), their Basic-auth base64,
  and the values of credential query parameters, each also percent-encoded;
- and, whatever their value, ``Bearer <token>``, ``Basic <base64>``, user info in a URL
  (``scheme://user:pass@``) and credential query parameters (``?key=``, ``token=``...).
"""

from __future__ import annotations

import os
import re
from typing import Iterable
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from biaslab.agents.providers import ModelSpec, client_url_parts, is_credential_param

__all__ = ["redact", "secrets_of", "MASK"]

MASK = "***"
_MIN_SECRET = 4  # shorter values (a user named "a") would mask ordinary words

_BEARER = re.compile(r"\b([Bb]earer)\s+[A-Za-z0-9._~+/=-]{6,}")
_BASIC = re.compile(r"\b(Basic)\s+[A-Za-z0-9+/]{6,}={0,2}")
_USERINFO = re.compile(r"(?<=://)[^/@\s'\"<>]+@")
_PARAM = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]+)=([^&\s'\"<>,;)}\]]+)")


def secrets_of(specs: Iterable[ModelSpec]) -> list[str]:
    """Every secret value these models' calls send, from the environment, longest first."""
    found: set[str] = set()
    for spec in specs:
        env = spec.key_env()
        if env and os.environ.get(env):
            found.add(os.environ[env])
        url = spec.resolved_base_url() if spec.provider not in ("local", "scripted") else None
        if not url:
            continue
        parts = urlsplit(url)
        headers = client_url_parts(url)[2]  # the user info's Basic token, as the client sends it
        if "Authorization" in headers:
            userinfo = parts.netloc.rsplit("@", 1)[0]
            password = userinfo.partition(":")[2]
            # The user name alone is no secret (and masking it would blank common words).
            found.update({password, unquote(password), userinfo, unquote(userinfo),
                          headers["Authorization"].partition(" ")[2]})
        found.update(value for name, value in parse_qsl(parts.query, keep_blank_values=True)
                     if is_credential_param(name))
    encoded = {quote(value, safe="") for value in found}
    return sorted({v for v in found | encoded if len(v) >= _MIN_SECRET}, key=len, reverse=True)


def _param(match: re.Match) -> str:
    name = match.group(1)
    return f"{name}={MASK}" if is_credential_param(name) else match.group(0)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every credential in it replaced by ``***`` (see the module docstring)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    text = _BEARER.sub(rf"\1 {MASK}", text)
    text = _BASIC.sub(rf"\1 {MASK}", text)
    text = _USERINFO.sub(f"{MASK}@", text)
    return _PARAM.sub(_param, text)
