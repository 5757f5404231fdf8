"""``biaslab view RUN_DIR``: a local web UI over a run store (stdlib http.server, 127.0.0.1).

A JSON API (``/api/...``) answers every view from SQL pages (see `store_queries`), and one
static page (vanilla JS, no build step) renders Cells, Call detail, Dialogue and Compare. The
server binds to 127.0.0.1 only: traces can hold anything a model said, so they are not served
to the network.

Exposure text is found by rendering the run's exposure template again from its recorded
spec.toml and prompt registry (the exact text the runner injected); when the plan cannot be
loaded (e.g. a user's protocol file is gone), the call is diffed against the clean cell's call
from the same node, item and sample instead.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from biaslab.errors import UserError
from biaslab.experiments.reports.html import DEFAULT_VIEWER_PORT
from biaslab.traces.store import STORE_FILE
from biaslab.viewer.assets import INDEX_HTML
from biaslab.viewer.store_queries import ViewerQueries

__all__ = ["ViewerApp", "make_server", "serve", "highlight_spans", "DEFAULT_VIEWER_PORT"]


_UNSET: Any = object()  # "not looked up yet", unlike None ("no clean cell")


def highlight_spans(content: str, texts: list[str]) -> list[list[int]]:
    """[start, end) spans of every occurrence of each exposure text in a message."""
    spans = []
    for text in texts:
        if not text:
            continue
        start = content.find(text)
        while start >= 0:
            spans.append([start, start + len(text)])
            start = content.find(text, start + len(text))
    return sorted(spans)


def diff_span(exposed: str, clean: str) -> list[list[int]]:
    """The span of `exposed` that differs from `clean` (common prefix and suffix removed)."""
    if exposed == clean:
        return []
    i = 0
    while i < min(len(exposed), len(clean)) and exposed[i] == clean[i]:
        i += 1
    j = 0
    while (j < min(len(exposed), len(clean)) - i
           and exposed[len(exposed) - 1 - j] == clean[len(clean) - 1 - j]):
        j += 1
    return [[i, len(exposed) - j]] if len(exposed) - j > i else []


class ViewerApp:
    """What the HTTP handler needs: the queries and the run's exposure texts."""

    def __init__(self, run_dir: str | Path, *, create_indexes: bool = True):
        self.run_dir = Path(run_dir)
        if not (self.run_dir / STORE_FILE).is_file():
            raise UserError(f"{run_dir} is not a run directory (no {STORE_FILE})")
        self.q = ViewerQueries(self.run_dir, create_indexes=create_indexes)
        self._lock = threading.Lock()

    @cached_property
    def _exposure_texts(self) -> dict[tuple[str, str], list[str]] | None:
        """(variant, condition id) → injected texts, from the recorded plan; None if the plan
        cannot be loaded again."""
        from biaslab.experiments.replay import load_run_plan

        try:
            plan = load_run_plan(self.run_dir, check_keys=False)
        except (UserError, Exception) as exc:  # a missing plugin must not stop the viewer
            print(f"biaslab view: exposure texts come from diffs ({exc})", file=sys.stderr)
            return None
        out = {}
        for variant, conditions in plan.conditions.items():
            for condition in conditions:
                out[(variant, condition.id)] = [e.text(plan.prompts)
                                                for e in condition.exposures]
        return out

    def exposure_texts(self, variant: str, condition: str) -> list[str] | None:
        with self._lock:
            texts = self._exposure_texts
        return None if texts is None else texts.get((variant, condition), [])

    # -- API --------------------------------------------------------------------------------
    def api(self, route: str, params: dict[str, str]) -> Any:
        q = self.q
        if route == "meta":
            return {"run_dir": str(self.run_dir.resolve()), "meta": q.meta(),
                    "facets": q.facets(), "has_dialogues": q.has_dialogues()}
        if route == "cells":
            return q.cells(params, limit=params.get("limit", 50),
                           offset=params.get("offset", 0))
        if route == "calls":
            return q.calls(params, limit=params.get("limit", 50), after=params.get("after", 0))
        if route == "cell":
            cell = q.cell(params.get("id", ""))
            if cell is None:
                raise KeyError("no such cell")
            return {"cell": cell, "calls": q.cell_calls(cell["cell_id"],
                                                        offset=params.get("offset", 0)),
                    "outputs": q.outputs(cell["cell_id"]),
                    "siblings": q.siblings(cell["cell_id"]),
                    "has_dialogue": q.dialogue(cell["cell_id"]) is not None}
        if route == "call":
            return self.call_detail(int(params.get("id", 0)))
        if route == "dialogue":
            cell = q.cell(params.get("cell", ""))
            dialogue = q.dialogue(params.get("cell", ""))
            if cell is None or dialogue is None:
                raise KeyError("no dialogue in this cell")
            return {"cell": cell, "dialogue": dialogue}
        if route == "compare":
            return self.compare(params.get("cell", ""), params.get("other"))
        raise KeyError(f"unknown API route {route}")

    def _marked(self, call: dict[str, Any], cell: dict[str, Any], clean: Any = _UNSET
                ) -> dict[str, Any]:
        """Add ``highlights`` (spans per message) and ``exposure_texts`` to a call. `clean`:
        the cell's clean counterpart when the caller already has it (no query per call)."""
        texts = self.exposure_texts(cell["variant"], cell["condition"]) \
            if call.get("exposed") else []
        method = "template"
        spans = [highlight_spans(m.get("content", ""), texts or []) for m in call["messages"]]
        if call.get("exposed") and (texts is None or not any(spans)):
            method = "diff against the clean cell"
            if clean is _UNSET:
                clean = self.clean_counterpart(cell)
            other = clean and self.q.matching_call(clean["cell_id"], call["node"],
                                                   call.get("item", ""), call.get("sample", 0),
                                                   call.get("attempt", 0))
            spans = []
            for i, m in enumerate(call["messages"]):
                ref = other["messages"][i]["content"] if other and i < len(
                    other["messages"]) else ""
                spans.append(diff_span(m.get("content", ""), ref) if other else [])
            if other and len(call["messages"]) > len(other["messages"]):
                spans[0] = [[0, len(call["messages"][0].get("content", ""))]]
        return {**call, "exposure_texts": texts or [], "highlights": spans,
                "highlight_method": method if call.get("exposed") else None}

    def clean_counterpart(self, cell: dict[str, Any]) -> dict[str, Any] | None:
        return next((s for s in self.q.siblings(cell["cell_id"]) if s["condition"] == "none"),
                    None)

    def call_detail(self, call_id: int) -> dict[str, Any]:
        call = self.q.call(call_id)
        if call is None:
            raise KeyError("no such call")
        cell = self.q.cell(call["cell_id"])
        judges = self.q.judge_calls(call["cell_id"], exclude=call_id)
        same = [j for j in judges if j["item"] == call.get("item")]
        return {"call": self._marked(call, cell), "cell": cell,
                "judges": (same or judges)[:20]}

    def compare(self, cell_id: str, other_id: str | None) -> dict[str, Any]:
        """One grid point under two conditions: calls paired by node, item, sample, attempt."""
        cell = self.q.cell(cell_id)
        if cell is None:
            raise KeyError("no such cell")
        siblings = self.q.siblings(cell_id)
        clean = next((s for s in siblings if s["condition"] == "none"), None)
        if other_id:
            other = self.q.cell(other_id)
        elif cell["condition"] == "none":
            other = next((s for s in siblings if s["condition"] != "none"), None)
        else:
            other = clean
        left, right = (cell, other) if cell["condition"] == "none" else (other, cell)
        point = {s["cell_id"] for s in siblings}
        sides = []
        for side in (left, right):
            if side is None:
                sides.append(None)
                continue
            calls = [self.q.call(c["id"]) for c in self.q.cell_calls(side["cell_id"], limit=60)]
            # a side at this grid point shares its clean cell; another (`other_id` elsewhere)
            # looks its own up, and only if a call needs it
            side_clean = clean if side["cell_id"] in point else _UNSET
            sides.append({"cell": side,
                          "calls": [self._marked(c, side, side_clean) for c in calls],
                          "outputs": self.q.outputs(side["cell_id"], limit=60)})
        return {"left": sides[0], "right": sides[1], "siblings": siblings}


def _finite(value: Any) -> Any:
    """JSON has no NaN: the API sends non-finite numbers as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _handler(app: ViewerApp):
    class Handler(BaseHTTPRequestHandler):
        server_version = "biaslab-view"

        def log_message(self, fmt, *args):  # quiet: the terminal shows only the URL
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            if url.path in ("/", "/index.html"):
                return self._send(200, INDEX_HTML.encode(), "text/html; charset=utf-8")
            if url.path == "/favicon.ico":
                return self._send(204, b"", "image/x-icon")
            if url.path.startswith("/api/"):
                params = {k: v[-1] for k, v in parse_qs(url.query).items()}
                try:
                    data = app.api(url.path.removeprefix("/api/"), params)
                    code = 200
                except KeyError as exc:
                    data, code = {"error": str(exc.args[0] if exc.args else exc)}, 404
                except (ValueError, TypeError) as exc:
                    data, code = {"error": f"bad request: {exc}"}, 400
                body = json.dumps(_finite(data), default=str).encode()
                return self._send(code, body, "application/json")
            return self._send(404, b"not found", "text/plain")

    return Handler


def make_server(run_dir: str | Path, port: int = DEFAULT_VIEWER_PORT, *,
                create_indexes: bool = True) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1 (port 0 picks a free one); call ``serve_forever``."""
    app = ViewerApp(run_dir, create_indexes=create_indexes)
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), _handler(app))
    except OSError as exc:
        raise UserError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); "
                        "choose another with --port") from None
    server.daemon_threads = True
    return server


def serve(run_dir: str | Path, port: int = DEFAULT_VIEWER_PORT) -> None:
    """Serve until interrupted, printing the URL."""
    server = make_server(run_dir, port)
    print(f"biaslab view: http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
