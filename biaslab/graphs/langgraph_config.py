"""``app = "langgraph.json:GRAPH"``: an app named the way LangGraph's own tooling names it.

A LangGraph project deployed with ``langgraph dev`` / LangGraph Platform lists its graphs in
``langgraph.json``::

    {"dependencies": ["."], "graphs": {"agent": "./src/agent.py:graph"}, "env": ".env"}

A graph is ``./path/to/file.py:attribute`` (relative to the JSON file) or
``package.module:attribute`` (importable once the ``dependencies`` are on the path), or, in
newer configs, ``{"path": "...", "description": "..."}``. Local ``dependencies`` (paths such as
``"."`` or ``"./src"``) go on ``sys.path`` as LangGraph's dev server has them installed. The
``env`` file (or table) is loaded into the process environment, without overriding variables
already set, because an app may read its settings when it is imported; its values are never
written anywhere biaslab records (the spec keeps ``langgraph.json:GRAPH``, the discovery memo
the graph file's hash), and the app's own endpoints are never called anyway.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from biaslab.errors import UserError

__all__ = ["is_langgraph_ref", "resolve_langgraph_ref"]


def is_langgraph_ref(ref: str) -> bool:
    """Whether `ref` names a graph of a ``langgraph.json`` (``path/langgraph.json:NAME``)."""
    target, colon, _ = ref.rpartition(":")
    return bool(colon) and target.endswith(".json")


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"app: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"app: cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise UserError(f"app: {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("graphs"), dict):
        raise UserError(f"app: {path} has no \"graphs\" table (LangGraph's langgraph.json "
                        "lists {\"name\": \"./file.py:graph\"} there)")
    return data


def _env_lines(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of a dotenv file (``export``, quotes and comments allowed)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"app: the env file {path} named in langgraph.json is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"app: cannot read the env file {path}: {exc}") from None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[key.strip()] = value
    return out


def _load_env(env: Any, base: Path) -> None:
    values = _env_lines(base / env) if isinstance(env, str) else \
        {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    for key, value in values.items():
        os.environ.setdefault(key, value)  # what the shell set wins, as under dotenv


def resolve_langgraph_ref(ref: str) -> str:
    """``langgraph.json:NAME`` as the ``file.py:attribute`` (absolute) or ``module:attribute``
    it names, with the config's dependencies on ``sys.path`` and its env loaded."""
    target, _, name = ref.rpartition(":")
    path = Path(target).resolve()
    config = _read_config(path)
    graphs = config["graphs"]
    if name not in graphs:
        raise UserError(f"app: {path.name} has no graph '{name}' (its graphs: "
                        f"{', '.join(sorted(graphs)) or 'none'})")
    entry = graphs[name]
    if isinstance(entry, dict):
        entry = entry.get("path")
    if not isinstance(entry, str) or ":" not in entry:
        raise UserError(f"app: graph '{name}' of {path.name} must read "
                        "\"./file.py:attribute\" or \"module:attribute\"")
    base = path.parent
    for dep in config.get("dependencies") or ():
        if isinstance(dep, str) and (dep.startswith(".") or dep.startswith("/")):
            folder = str((base / dep).resolve())
            if folder not in sys.path:
                sys.path.append(folder)
    if config.get("env") is not None:
        _load_env(config["env"], base)
    file, _, attr = entry.rpartition(":")
    if file.endswith(".py") or "/" in file:
        file = str((base / file).resolve())
    return f"{file}:{attr}"
