"""``biaslab view RUN_DIR``: a local web UI over a run store (stdlib http.server, 127.0.0.1).

A JSON API (``/api/...``) answers every view from SQL pages (see `store_queries`), and one
static page (vanilla JS, no build step) renders Cells, Call detail, Dialogue and Compare. The
server binds to 127.0.0.1 only: traces can hold anything a model said, so they are not served
to the network, and it answers only requests addressed to it (see `security`).

Exposure text is found by rendering the run's exposure template again from its recorded
spec.toml and prompt registry (the exact text the runner injected); when the plan cannot be
loaded (e.g. a user's protocol file is gone), the call is diffed against the clean cell's call
from the same node, item and sample instead.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import sys
import threading
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from biaslab.errors import UserError
from biaslab.experiments.reports.html import DEFAULT_VIEWER_PORT, REPORT_FILE
from biaslab.traces.store import STORE_FILE
from biaslab.viewer.assets import APP_CSS, APP_JS, INDEX_HTML
from biaslab.viewer.params import BadRequest, check_lengths, whole_number
from biaslab.viewer.security import (REPORT_POLICY, allowed_hosts, host_allowed,
                                     security_headers)
from biaslab.viewer.spans import aligned_rows, diff_span, highlight_spans
from biaslab.viewer.store_queries import ViewerQueries

__all__ = ["ViewerApp", "make_server", "serve", "highlight_spans", "diff_span", "aligned_rows",
           "DEFAULT_VIEWER_PORT"]


_UNSET: Any = object()  # "not looked up yet", unlike None ("no clean cell")


class ViewerApp:
    """What the HTTP handler needs: the queries and the run's exposure texts."""

    def __init__(self, run_dir: str | Path, *, create_indexes: bool = True):
        self.run_dir = Path(run_dir)
        if not (self.run_dir / STORE_FILE).is_file():
            raise UserError(f"{run_dir} is not a run directory (no {STORE_FILE})")
        self.q = ViewerQueries(self.run_dir, create_indexes=create_indexes)
        self._lock = threading.Lock()

    @cached_property
    def _plan(self) -> Any:
        """The run's plan, loaded again from its spec.toml; None if it cannot be."""
        from biaslab.experiments.replay import load_run_plan

        try:
            return load_run_plan(self.run_dir, check_keys=False)
        except (UserError, Exception) as exc:  # a missing plugin must not stop the viewer
            print(f"biaslab view: exposure texts come from diffs, and cells show no inputs "
                  f"({exc})", file=sys.stderr)
            return None

    @cached_property
    def _arm_texts(self) -> tuple[dict, dict] | None:
        """Two maps (variant, condition id) → texts, from the recorded plan: what the arm
        injects (exposures) and what it adds against it (mitigations); None if the plan
        cannot be loaded again."""
        plan = self._plan
        if plan is None:
            return None
        exposures, mitigations = {}, {}
        for variant, conditions in plan.conditions.items():
            for condition in conditions:
                exposures[(variant, condition.id)] = [e.text(plan.prompts)
                                                      for e in condition.exposures]
                try:
                    mitigations[(variant, condition.id)] = [
                        m.text(plan.prompts) for m in getattr(condition, "mitigations", ())]
                except Exception:  # noqa: BLE001 - only the marks are lost
                    mitigations[(variant, condition.id)] = []
        return exposures, mitigations

    def exposure_texts(self, variant: str, condition: str) -> list[str] | None:
        with self._lock:
            texts = self._arm_texts
        return None if texts is None else texts[0].get((variant, condition), [])

    def mitigation_texts(self, variant: str, condition: str) -> list[str]:
        """The mitigation instructions of a cell's arm (empty when it has none)."""
        with self._lock:
            texts = self._arm_texts
        return [] if texts is None else texts[1].get((variant, condition), [])

    def inputs(self, cell: dict[str, Any]) -> dict[str, Any] | None:
        """What the cell's graph started from (the protocol's ``initial_state`` for its item:
        a dialogue's seed stereotype, a record's fields), so that a page can show the item
        before the outputs; None when the plan or the item cannot be loaded again."""
        if "damaged" in cell:
            return None
        with self._lock:
            plan = self._plan
            if plan is None:
                return None
            try:
                state = plan.protocol.initial_state(cell["variant"], cell["item"],
                                                    int(cell["seed"]), plan.options)
            except Exception:  # noqa: BLE001 - an item gone from a dataset hides only this
                return None
        return {k: v for k, v in dict(state).items() if _plain_value(v)}

    # -- API --------------------------------------------------------------------------------
    def report_html(self) -> str | None:
        """The run's report.html with its viewer links made relative, so that they open this
        server whatever port it listens on; None when the run has no report."""
        path = self.run_dir / REPORT_FILE
        if not path.is_file():
            return None
        return _VIEWER_HREF.sub('href="/#/', path.read_text(encoding="utf-8", errors="replace"))

    def api(self, route: str, params: dict[str, str]) -> Any:
        q = self.q
        check_lengths(params)
        if route == "meta":
            meta = {k: v for k, v in q.meta().items() if k != "verdict_key"}  # not for show
            return {"run_dir": str(self.run_dir.resolve()), "meta": meta,
                    "facets": q.facets(), "has_dialogues": q.has_dialogues(),
                    "has_report": (self.run_dir / REPORT_FILE).is_file()}
        if route == "cells":
            return q.cells(params, limit=whole_number(params, "limit", 50),
                           offset=whole_number(params, "offset"))
        if route == "calls":
            return q.calls(params, limit=whole_number(params, "limit", 50),
                           after=whole_number(params, "after"))
        if route == "cell":
            cell = q.cell(params.get("id", ""))
            if cell is None:
                raise KeyError("no such cell")
            return {"cell": cell, "calls": q.cell_calls(cell["cell_id"],
                                                        offset=whole_number(params, "offset")),
                    "outputs": q.outputs(cell["cell_id"]),
                    "siblings": q.siblings(cell["cell_id"]),
                    "inputs": self.inputs(cell),
                    "has_dialogue": q.dialogue(cell["cell_id"]) is not None}
        if route == "call":
            return self.call_detail(whole_number(params, "id"))
        if route == "dialogue":
            cell = q.cell(params.get("cell", ""))
            dialogue = q.dialogue(params.get("cell", ""))
            if cell is None or dialogue is None:
                raise KeyError("no dialogue in this cell")
            return {"cell": cell, "dialogue": dialogue, "inputs": self.inputs(cell)}
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
        mitigations = self.mitigation_texts(cell.get("variant", ""), cell["condition"])
        return {**call, "exposure_texts": texts or [], "highlights": spans,
                "highlight_method": method if call.get("exposed") else None,
                "mitigation_texts": mitigations,
                "mitigation_highlights": [highlight_spans(m.get("content", ""), mitigations)
                                          for m in call["messages"]]}

    def clean_counterpart(self, cell: dict[str, Any]) -> dict[str, Any] | None:
        return next((s for s in self.q.siblings(cell["cell_id"]) if s["condition"] == "none"),
                    None)

    def call_detail(self, call_id: int) -> dict[str, Any]:
        call = self.q.call(call_id)
        if call is None:
            raise KeyError("no such call")
        cell = self.q.cell(call["cell_id"])
        if cell is None:
            raise KeyError(f"call {call_id} names cell {call['cell_id']}, which is not stored")
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
        rows = aligned_rows(sides[0]["calls"] if sides[0] else [],
                            sides[1]["calls"] if sides[1] else [])
        return {"left": sides[0], "right": sides[1], "siblings": siblings, "rows": rows,
                "measures": self.paired_measures(left, right)}

    def paired_measures(self, left: dict | None, right: dict | None) -> list[dict[str, Any]]:
        """The protocol's unit measures of the two cells side by side, as
        ``exposed_vs_clean.csv`` reads them (its loop counters and ids left out, single
        labels kept); empty when the run's plan cannot be loaded again."""
        from biaslab.experiments.reports.units import cell_measures

        with self._lock:
            plan = self._plan
        if plan is None:
            return []
        keyed: dict[tuple, dict[str, Any]] = {}
        for side, cell in (("left", left), ("right", right)):
            if cell is None or "damaged" in cell:
                continue
            outputs = [(o["node"], o["value"]) for o in self.q.outputs(cell["cell_id"])]
            try:
                found = cell_measures(plan.protocol, plan.options, cell["variant"], cell,
                                      outputs)
            except Exception:  # noqa: BLE001 - a protocol's reader must not break the page
                return []
            for m in found:
                key = (m["node"], m["visit"], m["unit"], m["stratum"], m["field"])
                row = keyed.setdefault(key, {"node": m["node"], "unit": m["unit"],
                                             "stratum": m["stratum"], "field": m["field"],
                                             "left": None, "right": None})
                row[side] = m["value"]
        rows = list(keyed.values())
        for row in rows:
            row["changed"] = row["left"] != row["right"]
        return rows


def _plain_value(value: Any) -> bool:
    """Whether an input is worth showing as a field: text, a number, a flag (no frames)."""
    return value is None or isinstance(value, (str, int, float, bool))


_VIEWER_HREF = re.compile(r'href="http://127\.0\.0\.1:\d+/#/')
"""How report.html links into the viewer (`viewer_link`)."""


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
        policy: str | None = None  # per response; None: the viewer page's policy

        def log_message(self, fmt, *args):  # quiet: the terminal shows only the URL
            pass

        def end_headers(self):
            # here, so that http.server's own error pages (414, 501...) carry them too
            for name, value in security_headers(*([self.policy] if self.policy else [])):
                self.send_header(name, value)
            super().end_headers()

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, data: Any) -> None:
            self._send(code, json.dumps(_finite(data), default=str).encode(),
                       "application/json")

        def send_error(self, code, message=None, explain=None):
            """http.server's own refusals (a request line over 64 kB, another method, a
            malformed request) as one-line JSON, like the API's."""
            self.close_connection = True
            short, _ = self.responses.get(code, ("error", ""))
            self.policy = None
            body = json.dumps({"error": f"{code} {message or short}"}).encode()
            self.send_response(code, message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's name)
            self.policy = None
            if not host_allowed(self.headers.get("Host"), self.server.allowed_hosts):
                # 421: this server is not the one the request names (DNS rebinding)
                return self._json(421, {"error": "this server answers only requests to "
                                        + " or ".join(sorted(self.server.allowed_hosts))
                                        + " (through an SSH tunnel, forward the same port)"})
            url = urlparse(self.path)
            if url.path in ("/", "/index.html"):
                return self._send(200, INDEX_HTML.encode(), "text/html; charset=utf-8")
            if url.path == "/app.js":
                return self._send(200, APP_JS.encode(), "text/javascript; charset=utf-8")
            if url.path == "/app.css":
                return self._send(200, APP_CSS.encode(), "text/css; charset=utf-8")
            if url.path == "/favicon.ico":
                return self._send(204, b"", "image/x-icon")
            if url.path == f"/{REPORT_FILE}":
                report = app.report_html()
                if report is None:
                    return self._send(404, b"this run has no report.html", "text/plain")
                self.policy = REPORT_POLICY
                return self._send(200, report.encode(), "text/html; charset=utf-8")
            if url.path.startswith("/api/"):
                return self._api(url)
            return self._send(404, b"not found", "text/plain")

        def _api(self, url) -> None:
            try:
                params = {k: v[-1] for k, v in parse_qs(url.query, max_num_fields=100).items()}
                data = app.api(url.path.removeprefix("/api/"), params)
                code = 200
            except KeyError as exc:
                data, code = {"error": str(exc.args[0] if exc.args else exc)}, 404
            except (ValueError, TypeError) as exc:  # BadRequest included
                message = str(exc) if isinstance(exc, BadRequest) else f"bad request: {exc}"
                data, code = {"error": message}, 400
            except sqlite3.Error as exc:
                data, code = {"error": f"the run store could not be read: {exc}"}, 500
                print(f"biaslab view: {url.path}: {exc}", file=sys.stderr)
            except Exception as exc:  # noqa: BLE001 - one line, never a dropped connection
                data, code = {"error": f"internal error: {type(exc).__name__}: {exc}"}, 500
                print(f"biaslab view: {url.path}: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
            return self._json(code, data)

    return Handler


BIND_HOST = "127.0.0.1"


def make_server(run_dir: str | Path, port: int = DEFAULT_VIEWER_PORT, *,
                create_indexes: bool = True) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1 (port 0 picks a free one); call ``serve_forever``."""
    app = ViewerApp(run_dir, create_indexes=create_indexes)
    try:
        server = ThreadingHTTPServer((BIND_HOST, port), _handler(app))
    except OSError as exc:
        raise UserError(f"cannot listen on {BIND_HOST}:{port} ({exc.strerror}); "
                        "choose another with --port") from None
    except OverflowError:
        raise UserError(f"--port must be between 0 and 65535, got {port}") from None
    server.daemon_threads = True
    server.allowed_hosts = allowed_hosts(BIND_HOST, server.server_address[1])
    return server


def serve(run_dir: str | Path, port: int = DEFAULT_VIEWER_PORT) -> None:
    """Serve until interrupted, printing the URL."""
    server = make_server(run_dir, port)
    url = f"http://{BIND_HOST}:{server.server_address[1]}/"
    report = (f"; its report, with links to this port: {url}{REPORT_FILE}"
              if (Path(run_dir) / REPORT_FILE).is_file() else "")
    print(f"biaslab view: {url}  (Ctrl-C stops){report}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
