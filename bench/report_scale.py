"""`biaslab report` on a paper-size store of each protocol: peak RSS, wall and CPU (issue 22, item 4).

    python bench/report_scale.py --protocol multiturn          # build + report, row saved
    python bench/report_scale.py --protocol augmentation --reuse
    python bench/report_scale.py --protocol multiturn --reuse --warm-embeddings  # 2nd report
    python bench/report_scale.py --write-saved                 # results.md from saved rows
    python bench/report_scale.py --all --reuse --write         # every protocol; results.md
    python bench/report_scale.py --protocol multiturn --fraction 0.1   # a quick look
    python bench/report_scale.py --protocol multiturn --distinct-queries  # ~31k texts to embed

Amplification has two paper specs (Math and Portuguese): ``amplification`` and
``amplification-por``.

Each store is built the way a user's run would be, then copied to more models, as
`bench/roleplay_report_scale.py` does for roleplay (that script still builds roleplay's store;
``--protocol roleplay`` here only reports on the store it built):

1. ``biaslab run`` of the paper-scale spec (``experiments/<protocol>.toml``, its default scale)
   with one scripted model (the protocol's ``scripted:<protocol>-synthetic`` target, which also
   plays every other node), so every cell, call record and node output is a real one.
2. Its cells, call records and outputs are copied in SQL under more model names, up to the
   number of target models of the paper's spec (multiturn 6, augmentation 5, amplification 5).

Then ``biaslab report RUN`` runs in a fresh subprocess, as a user runs it; its peak RSS is the
``ru_maxrss`` of that process alone (``os.wait4``), its CPU is that process's user + system
time, its wall time is measured around it. Targets (issue 22): at most 2 GB and 10 minutes.

Nothing here is a test. With ``--write`` the figures go to the "Reports at paper scale" section
of bench/results.md (other sections kept; rows of protocols not measured this time are kept).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import tomli_w

from results_file import RESULTS, write_section  # a sibling: bench/ is on sys.path as a script

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SECTION = "## Reports at paper scale (`bench/report_scale.py`)"
TARGET_RSS_GB, TARGET_WALL_S = 2.0, 600.0
ROOT = Path("/tmp/report-scale")

# protocol -> (paper spec, scripted model that plays every node)
PROTOCOLS = {
    "multiturn": ("experiments/multiturn.toml", "scripted:multiturn-late"),
    "augmentation": ("experiments/augmentation.toml", "scripted:augmentation-synthetic"),
    "amplification": ("experiments/amplification_math.toml", "scripted:amplification-synthetic"),
    "amplification-por": ("experiments/amplification_por.toml",
                          "scripted:amplification-synthetic"),
    "roleplay": ("experiments/roleplay.toml", "scripted:roleplay-synthetic"),
}
WARM = " (embeddings stored)"  # a second report: multiturn reads its embeddings back
LABELS = [label for p in PROTOCOLS for label in (p, p + WARM)]
ROLEPLAY_DIR = Path("/tmp/roleplay-report-bench/run")  # built by bench/roleplay_report_scale.py


def _biaslab() -> str:
    exe = Path(sys.executable).with_name("biaslab")
    return str(exe) if exe.exists() else "biaslab"


def scripted_spec(protocol: str, fraction: float) -> tuple[dict, int]:
    """The paper spec with one scripted model in every role, and the paper's model count.
    `fraction` < 1 shrinks the item axis (a quick look, not paper size)."""
    path, model = PROTOCOLS[protocol]
    spec = tomllib.loads((REPO / path).read_text(encoding="utf-8"))
    n_models = len(spec["models"])
    spec.pop("scale", None)
    spec["name"] = f"{protocol}-report-bench"
    spec["models"] = [model]
    spec.setdefault("run", {})["concurrency"] = 32
    spec["run"]["retry_base_s"] = 0.0
    for node in spec.get("nodes", {}).values():
        node["model"] = model
    options = spec.setdefault("options", {})
    if fraction < 1:
        if protocol == "multiturn":
            options["seeds_per_category"] = max(1, round(options["seeds_per_category"] * fraction))
        elif protocol == "augmentation":
            # the paper sample's largest category holds 371 items (ses); a cap, not a share
            options["max_per_category"] = max(1, round(371 * fraction))
        elif protocol.startswith("amplification"):
            options["max_test"] = max(10, round(100 * fraction))
    return spec, n_models


def _models(conn) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT json_extract(coords, '$.model') FROM cells")]


def copy_models(db: Path, model: str, n_models: int) -> None:
    """Copy every cell, call record and output of `model` under `n_models - 1` more names."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    for k in range(2, n_models + 1):
        copy = f"{model}-copy{k}"
        old, new = f"/{model}/", f"/{copy}/"
        offset = conn.execute("SELECT MAX(ord) + 1 FROM cells").fetchone()[0]
        conn.execute("INSERT INTO cells SELECT replace(cell_id, ?1, ?2), ord + ?3, "
                     "replace(coords, ?4, ?5), status, error, started, finished FROM cells "
                     "WHERE instr(cell_id, ?1) > 0",
                     (old, new, offset, f'"model":"{model}"', f'"model":"{copy}"'))
        cols = ("seq, node, cache_key, cache_hit, input_tokens, output_tokens, error, "
                "parse_error")
        conn.execute(f"INSERT INTO calls (cell_id, record, {cols}) SELECT "
                     f"replace(cell_id, ?1, ?2), replace(record, ?1, ?2), {cols} FROM calls "
                     "WHERE instr(cell_id, ?1) > 0", (old, new))
        conn.execute("INSERT INTO outputs SELECT replace(cell_id, ?1, ?2), seq, node, value "
                     "FROM outputs WHERE instr(cell_id, ?1) > 0", (old, new))
    conn.execute("COMMIT")
    conn.close()


_OLD_PREFIX = re.compile(r"^\[\d+\] ")


def make_queries_distinct(db: Path) -> None:
    """Multiturn: make every dynamic dialogue turn's user-simulator query a text of its own
    (`_make_queries_distinct`, in one transaction), so a first report embeds as many distinct
    texts as a real paper-scale run's; static scripts (the dataset's) stay shared. The
    scripted simulator repeats a few texts; a real one does not."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    _make_queries_distinct(conn)
    conn.execute("COMMIT")
    conn.close()


def _make_queries_distinct(conn) -> None:
    """Prefix each dynamic dialogue turn's query with a short number of its own ("[417] ": a
    few tokens, so texts keep their length), the same number wherever that turn's query is
    stored: the user simulator's output and the finished dialogue's turns, which a real run
    holds as one text. A dialogue's turn k is also the same text under both turn caps (the
    same prompts: a real run answers the shorter one from the cache), so the cap is left out
    of what the number identifies. Idempotent: a number put there before is replaced."""
    ids: dict[tuple[str, int], int] = {}

    def numbered(dialogue: str, entry: dict) -> None:
        query = entry.get("query")
        if isinstance(query, str) and query:
            n = ids.setdefault((dialogue, int(entry["turn"])), len(ids))
            entry["query"] = f"[{n}] " + _OLD_PREFIX.sub("", query)

    rows = []
    for rowid, cell_id, value in conn.execute(
            "SELECT rowid, cell_id, value FROM outputs WHERE cell_id LIKE 'dynamic-%' "
            "AND instr(value, '\"query\":\"') > 0 ORDER BY cell_id, seq"):
        dialogue = cell_id.replace("-t10/", "/").replace("-t5/", "/")
        data = json.loads(value)
        for entry in data.get("queries") or ():
            numbered(dialogue, entry)
        for entry in (data.get("dialogue") or {}).get("turns") or ():
            numbered(dialogue, entry)
        rows.append((json.dumps(data, ensure_ascii=False, separators=(",", ":")), rowid))
    conn.executemany("UPDATE outputs SET value = ? WHERE rowid = ?", rows)


def distinct_query_count(run_dir: Path) -> int:
    """Distinct non-empty user queries of the store's finished dialogues: the texts a first
    multiturn report embeds (its diversity table's)."""
    conn = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    n = conn.execute("SELECT COUNT(DISTINCT json_extract(t.value, '$.query')) FROM outputs o, "
                     "json_each(o.value, '$.dialogue.turns') t WHERE json_valid(o.value) AND "
                     "json_extract(o.value, '$.dialogue') IS NOT NULL AND "
                     "json_extract(t.value, '$.query') <> ''").fetchone()[0]
    conn.close()
    return n


def build(protocol: str, run_dir: Path, fraction: float, distinct_queries: bool = False) -> dict:
    """Run the scripted spec once, then copy it to the paper's number of model names."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    spec, n_models = scripted_spec(protocol, fraction)
    spec_path = run_dir.parent / "spec.toml"
    spec_path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    env = dict(os.environ, BIASLAB_CACHE="off")
    start = time.perf_counter()
    subprocess.run([_biaslab(), "run", str(spec_path), "--out", str(run_dir), "--no-report",
                    "--quiet"], check=True, env=env, cwd=REPO)
    run_s = time.perf_counter() - start
    start = time.perf_counter()
    copy_models(run_dir / "run.sqlite", spec["models"][0], n_models)
    if distinct_queries:
        make_queries_distinct(run_dir / "run.sqlite")
    return {"run_s": run_s, "copy_s": time.perf_counter() - start}


def counts(run_dir: Path) -> dict:
    conn = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    q = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
    out = {"cells": q("SELECT COUNT(*) FROM cells"), "calls": q("SELECT COUNT(*) FROM calls"),
           "models": len(_models(conn)),
           "store_mb": (run_dir / "run.sqlite").stat().st_size / 2**20}
    conn.close()
    return out


def forget_embeddings(run_dir: Path) -> None:
    """Empty the store's ``embeddings`` table (multiturn's diversity keeps them there), so the
    report measured is a first one: each distinct text embedded once, none read back."""
    conn = sqlite3.connect(run_dir / "run.sqlite", isolation_level=None)
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'embeddings'").fetchone():
        conn.execute("DELETE FROM embeddings")
    conn.close()


def report(run_dir: Path, cold: bool = True) -> dict:
    """`biaslab report RUN` in a fresh process (roleplay_report_scale's measure): its own peak
    RSS, CPU and the wall time; `cold` forgets the stored embeddings first."""
    from roleplay_report_scale import report as measured_report  # a sibling, like results_file

    if cold:
        forget_embeddings(run_dir)
    return {**measured_report(run_dir), "load": os.getloadavg()}


def row(protocol: str, store: dict, result: dict, scale: str) -> str:
    ok = (result["peak_rss_gb"] <= TARGET_RSS_GB and result["wall_s"] <= TARGET_WALL_S)
    load = result["load"]
    return (f"| {protocol} | {scale} | {store['models']} | {store['cells']:,} | "
            f"{store['calls']:,} | {store['store_mb']:,.0f} | {result['wall_s']:.0f} | "
            f"{result['cpu_s']:.0f} | {result['peak_rss_gb']:.2f} | "
            f"{'yes' if ok else 'NO'} | {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} |")


HEADER = ["| protocol | scale | models | cells | call records | store MiB | wall s | CPU s | "
          "peak RSS GB | within targets | load avg (1/5/15 min) at end |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]


SAVED = ROOT / "rows.md"  # every row measured, kept beside the stores (last one wins)


def _save_row(line: str) -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(SAVED, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _old_rows(path: Path = RESULTS, heading: str = SECTION) -> dict[str, str]:
    """The rows of the section already in results.md (or of the saved rows), by protocol."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if path != RESULTS:
        text = heading + "\n" + text
    start = text.find(SECTION)
    if start < 0:
        return {}
    end = text.find("\n## ", start + len(SECTION))
    body = text[start:end if end >= 0 else len(text)]
    return {line.split("|")[1].strip(): line for line in body.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in LABELS}


def write(rows: dict[str, str], command: str, notes: list[str] = ()) -> None:
    sys.path.insert(0, str(BENCH_DIR))
    from machine import describe
    merged = {**_old_rows(), **_old_rows(SAVED), **rows}
    section = "\n".join([
        SECTION, "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {describe(('pandas', 'numpy'))}",
        f"- command: `{command}`",
        "- store: one real `biaslab run` of the paper-scale spec (`experiments/<protocol>.toml`) "
        "with one scripted model in every role, then its cells, call records and outputs copied "
        "in SQL under more model names up to the paper's count; `biaslab report` in a fresh "
        "process, peak RSS = its own ru_maxrss, CPU = its user + system time. Targets: "
        f"{TARGET_RSS_GB:.0f} GB, {TARGET_WALL_S:.0f} s. Roleplay's store is built by "
        "`bench/roleplay_report_scale.py`.", "",
        *HEADER, *(merged[p] for p in LABELS if p in merged), "",
        *(f"{note}\n" for note in notes)])
    write_section(SECTION, section)
    print(f"wrote {RESULTS}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), action="append", default=[])
    parser.add_argument("--all", action="store_true", help="every protocol")
    parser.add_argument("--fraction", type=float, default=1.0,
                        help="shrink the item axis (a quick look; never written)")
    parser.add_argument("--root", default=str(ROOT),
                        help="where the stores are built (default %(default)s)")
    parser.add_argument("--reuse", action="store_true", help="keep the stores already built")
    parser.add_argument("--write", action="store_true", help="write the results.md section")
    parser.add_argument("--write-saved", action="store_true",
                        help=f"write the results.md section from the rows measured so far "
                        f"({SAVED}), measuring nothing")
    parser.add_argument("--note", action="append", default=[],
                        help="a paragraph written under the table (with --write)")
    parser.add_argument("--warm-embeddings", action="store_true",
                        help="keep the embeddings a previous report stored (default: a first "
                        "report, which embeds every distinct text)")
    parser.add_argument("--distinct-queries", action="store_true",
                        help="multiturn: each copied model's dynamic dialogues get queries of "
                        "their own (a real run's number of distinct texts to embed)")
    args = parser.parse_args(argv)
    protocols = list(PROTOCOLS) if args.all else args.protocol
    if args.write_saved:
        write({}, f"python bench/report_scale.py --protocol P (each P; rows saved in {SAVED})",
              args.note)
        return 0
    if not protocols:
        parser.error("name a --protocol or give --all")
    rows = {}
    for protocol in protocols:
        run_dir = ROLEPLAY_DIR if protocol == "roleplay" else Path(args.root) / protocol / "run"
        if protocol != "roleplay" and not (args.reuse and (run_dir / "run.sqlite").exists()):
            built = build(protocol, run_dir, args.fraction,
                          args.distinct_queries and protocol == "multiturn")
            print(f"{protocol}: scripted run {built['run_s']:.0f} s, copies "
                  f"{built['copy_s']:.0f} s", flush=True)
        elif protocol == "multiturn" and args.distinct_queries:  # a reused store: as built now
            make_queries_distinct(run_dir / "run.sqlite")
        if not (run_dir / "run.sqlite").exists():
            print(f"{protocol}: no store at {run_dir}", file=sys.stderr)
            return 2
        store = counts(run_dir)
        if protocol == "multiturn":
            print(f"multiturn: {distinct_query_count(run_dir):,} distinct user queries in "
                  "the store's dialogues (the texts a first report embeds)", flush=True)
        result = report(run_dir, cold=not args.warm_embeddings)
        scale = "paper" if args.fraction >= 1 else f"--fraction {args.fraction:g} (a look)"
        label = protocol + (" (queries distinct per model)" if args.distinct_queries
                            and protocol == "multiturn" else "") \
            + (WARM if args.warm_embeddings else "")
        rows[label] = row(label, store, result, scale)
        print(rows[label], flush=True)
        if args.fraction >= 1:
            _save_row(rows[label])
    if args.write and args.fraction >= 1:
        command = [a for a in (argv or sys.argv[1:]) if a not in args.note and a != "--note"]
        write(rows, "python bench/report_scale.py " + " ".join(command), args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
