"""The report's view of an audited app's own traffic: ``tables/app_http.csv``.

Model calls are the calls table's; everything else the app sent went to a host the spec allows
(``allow_hosts``; all other traffic is refused, `biaslab.agents.app_guard`). Each cell keeps
those exchanges in its output (``http``: node, method, URL without credentials, status,
bytes), so the table is written from the run store alone, like every report table, and only
when the app sent anything.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from biaslab.graphs.report_sections import ReportSection

__all__ = ["write_app_http", "HTTP_COLUMNS", "APP_HTTP_SECTION"]

HTTP_COLUMNS = ("cell_id", "item", "target", "direction", "node", "method", "url", "status",
                "bytes")


def write_app_http(store, run_dir: Path, app_node: str) -> list[Path]:
    """One row per exchange, in cell order; nothing written when the app sent nothing."""
    rows = []
    for coords, value in store.finished_outputs(app_node):
        for exchange in (value or {}).get("http") or ():
            rows.append({"cell_id": coords["cell_id"], "item": coords.get("item"),
                         "target": coords.get("target"), "direction": coords.get("direction"),
                         **{k: exchange.get(k) for k in HTTP_COLUMNS[4:]}})
    if not rows:
        return []
    path = Path(run_dir) / "tables" / "app_http.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows, columns=list(HTTP_COLUMNS))
    frame["bytes"] = frame["bytes"].astype("Int64")  # unknown (no Content-Length) stays empty
    frame.to_csv(path, index=False)
    return [path]


APP_HTTP_SECTION = ReportSection(
    title="The app's own traffic",
    tables=("tables/app_http.csv",),
    how_to_read="One row per request the app's own code sent, besides its model calls, to a "
                "host the spec allows (allow_hosts): node, method (CONNECT for a client below "
                "HTTP), URL without credentials, status and size. Every other connection was "
                "refused and failed its cell.",
    link_columns={"cell_id": "cell"})
