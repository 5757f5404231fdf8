"""How fast `biaslab view` answers on a store with 1,000,000 call records.

Builds a synthetic run store (20,000 cells x 50 small call records, one transaction), serves it
with the viewer on a free port and times the HTTP API: the first page of the cells view
(unfiltered and filtered), a filtered calls query (node + model, keyset page) and one call's
detail. Not a test: it prints a Markdown table to append to bench/results.md.

    python bench/viewer_scale.py [--cells 20000] [--calls-per-cell 50] [--dir /tmp/viewer-bench]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import threading
import time
from pathlib import Path
from urllib.request import urlopen

from biaslab.traces.records import CallRecord
from biaslab.traces.store import RunStore
from biaslab.viewer import make_server

NODES = ["explanation", "prediction", "judge"]
MODELS = ["openrouter:a", "openrouter:b", "openrouter:c", "openrouter:d"]
CONDITIONS = [("none", "none"), ("prediction", "pro_female"), ("prediction", "pro_male"),
              ("judge", "pro_female"), ("judge", "pro_male")]


def build(run_dir: Path, n_cells: int, per_cell: int) -> float:
    shutil.rmtree(run_dir, ignore_errors=True)
    store = RunStore(run_dir)
    store.set_meta(spec_name="bench", protocol="amplification", scale="bench",
                   created=time.time())
    start = time.perf_counter()
    conn = store.conn
    conn.execute("BEGIN")
    cells, calls = [], []
    for i in range(n_cells):
        target, direction = CONDITIONS[i % len(CONDITIONS)]
        coords = {"protocol": "amplification", "variant": f"E{i % 3}", "item": f"item-{i // 20}",
                  "target": target, "direction": direction, "model": MODELS[(i // 5) % 4],
                  "seed": 42 + (i // 4000)}
        cell_id = f"E{i % 3}/item-{i // 20}/{target}:{direction}/{coords['model']}/{i}"
        cells.append((cell_id, i, json.dumps(coords), "done", None, 0.0, 1.0))
        for k in range(per_cell):
            node = NODES[k % 3]
            rec = CallRecord(cell_id=cell_id, node=node, item=f"b{k}", exposed=target == node,
                             messages=[{"role": "user", "content": f"question {k}"}],
                             raw="OUTPUT: [0.4]", parsed=[0.4], input_tokens=20,
                             output_tokens=5)
            calls.append((cell_id, k, rec.model_dump_json(), node, "", 0, 20, 5, None, None))
        if len(calls) >= 100_000:
            conn.executemany("INSERT INTO calls (cell_id, seq, record, node, cache_key, "
                             "cache_hit, input_tokens, output_tokens, error, parse_error) "
                             "VALUES (?,?,?,?,?,?,?,?,?,?)", calls)
            calls = []
    conn.executemany("INSERT INTO cells VALUES (?,?,?,?,?,?,?)", cells)
    if calls:
        conn.executemany("INSERT INTO calls (cell_id, seq, record, node, cache_key, cache_hit, "
                         "input_tokens, output_tokens, error, parse_error) "
                         "VALUES (?,?,?,?,?,?,?,?,?,?)", calls)
    conn.execute("COMMIT")
    store.close()
    return time.perf_counter() - start


def timed(url: str, repeats: int = 5) -> tuple[float, float, int]:
    times, size = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        with urlopen(url, timeout=120) as r:
            size = len(r.read())
        times.append(time.perf_counter() - t)
    return times[0], statistics.median(times), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20_000)
    ap.add_argument("--calls-per-cell", type=int, default=50)
    ap.add_argument("--dir", default="/tmp/viewer-bench")
    args = ap.parse_args()
    run_dir = Path(args.dir)
    build_s = build(run_dir, args.cells, args.calls_per_cell)
    t = time.perf_counter()
    server = make_server(run_dir, port=0)
    index_s = time.perf_counter() - t
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/api"
    queries = {
        "meta + filter menus": f"{base}/meta",
        "cells, first page": f"{base}/cells?limit=50",
        "cells, filtered (condition+model+seed)":
            f"{base}/cells?limit=50&condition=prediction:pro_female&model=openrouter:c&seed=43",
        "cells, page 200 (offset 10,000)": f"{base}/cells?limit=50&offset=10000",
        "calls, filtered (node+model), first page":
            f"{base}/calls?limit=50&node=judge&model=openrouter:b",
        "calls of one cell": f"{base}/calls?cell=E1/item-500/none:none/openrouter:a/10000",
        "call detail (+judges)": f"{base}/call?id=777777",
    }
    n_calls = args.cells * args.calls_per_cell
    print(f"\n## Viewer at scale ({time.strftime('%Y-%m-%d')}, `bench/viewer_scale.py`)\n")
    print(f"Synthetic store: {args.cells:,} cells, {n_calls:,} call records "
          f"(built in {build_s:.1f} s; viewer start incl. lazy `calls(node, id)` index "
          f"{index_s:.1f} s). Times over HTTP on 127.0.0.1, first request and median of 5.\n")
    print("| query | first (s) | median (s) | bytes |\n|---|---:|---:|---:|")
    for name, url in queries.items():
        first, median, size = timed(url)
        print(f"| {name} | {first:.3f} | {median:.3f} | {size:,} |")
    server.shutdown()


if __name__ == "__main__":
    main()
