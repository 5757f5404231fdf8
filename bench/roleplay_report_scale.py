"""`biaslab report` on a paper-size roleplay store: peak RSS and wall time (issue 17).

    python bench/roleplay_report_scale.py                 # build (~3-4 min) + report; writes results.md
    python bench/roleplay_report_scale.py --reuse         # report again on the store already built
    python bench/roleplay_report_scale.py --per-stratum 30 --no-write   # a small store, print only

The store is built the way a user's run would be, then copied to more models:

1. ``biaslab run`` of the roleplay protocol on the whole shipped bank (32,864 questions), one
   scripted model (``scripted:roleplay-synthetic``), clean arm only, 3 repeats, both variants
   and the bias-type classifier: every cell, call record and node output is the real one.
2. Its cells, call records and outputs are copied in SQL under four more model names, as if the
   same answers had come from five models (the paper's design with five targets: 32,864 × 2
   conditions × 5 models ≈ 329k question rows, each with 3 answers ≈ 986k answers).

Then ``biaslab report RUN`` runs in a fresh subprocess, exactly as a user runs it; its peak RSS
is the ``ru_maxrss`` of that process alone (``os.wait4``) and its wall time is measured around
it. The targets (issue 17): at most 2 GB and 10 minutes on the 2-core development machine.

Nothing here is a test; results go to the "Roleplay report at paper scale" section of
bench/results.md (other sections kept), or only printed with ``--no-write``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from results_file import write_section  # a sibling: bench/ is on sys.path when run as a script

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SECTION = "## Roleplay report at paper scale (`bench/roleplay_report_scale.py`)"
MODEL = "scripted:roleplay-synthetic"
TARGET_RSS_GB, TARGET_WALL_S = 2.0, 600.0


def _biaslab() -> str:
    exe = Path(sys.executable).with_name("biaslab")
    return str(exe) if exe.exists() else "biaslab"


def build(run_dir: Path, per_stratum: int | None, models: int) -> dict:
    """Run the scripted protocol once, then copy it to `models` model names in SQL."""
    shutil.rmtree(run_dir.parent / "run", ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    spec = run_dir.parent / "spec.toml"
    sample = f"per_stratum = {per_stratum}\n" if per_stratum else ""
    spec.write_text(
        'name = "roleplay-report-bench"\nprotocol = "roleplay"\n'
        f'models = ["{MODEL}"]\n[run]\nseeds = [42]\nconcurrency = 32\n'
        "[conditions]\ntargets = []\n"
        f"[options]\nrepeats = 3\n{sample}", encoding="utf-8")
    env = dict(os.environ, BIASLAB_CACHE="off")
    start = time.perf_counter()
    subprocess.run([_biaslab(), "run", str(spec), "--out", str(run_dir), "--no-report",
                    "--quiet"], check=True, env=env, cwd=REPO)
    run_s = time.perf_counter() - start
    start = time.perf_counter()
    conn = sqlite3.connect(run_dir / "run.sqlite", isolation_level=None)
    conn.execute("BEGIN")
    for k in range(2, models + 1):
        copy = f"{MODEL}-copy{k}"
        offset = conn.execute("SELECT MAX(ord) + 1 FROM cells").fetchone()[0]
        conn.execute("INSERT INTO cells SELECT replace(cell_id, ?1, ?2), ord + ?3, "
                     "replace(coords, ?1, ?2), status, error, started, finished FROM cells "
                     "WHERE instr(cell_id, ?4) > 0", (f"/{MODEL}/", f"/{copy}/", offset,
                                                       f"/{MODEL}/"))
        conn.execute("UPDATE cells SET coords = replace(coords, ?1, ?2) WHERE instr(cell_id, ?3)"
                     " > 0", (f'"model":"{MODEL}"', f'"model":"{copy}"', f"/{copy}/"))
        cols = ("seq, node, cache_key, cache_hit, input_tokens, output_tokens, error, "
                "parse_error")
        conn.execute(f"INSERT INTO calls (cell_id, record, {cols}) SELECT "
                     f"replace(cell_id, ?1, ?2), replace(record, ?1, ?2), {cols} FROM calls "
                     "WHERE instr(cell_id, ?1) > 0", (f"/{MODEL}/", f"/{copy}/"))
        conn.execute("INSERT INTO outputs SELECT replace(cell_id, ?1, ?2), seq, node, value "
                     "FROM outputs WHERE instr(cell_id, ?1) > 0", (f"/{MODEL}/", f"/{copy}/"))
    conn.execute("COMMIT")
    copy_s = time.perf_counter() - start
    return {"run_s": run_s, "copy_s": copy_s, **counts(run_dir)}


def counts(run_dir: Path) -> dict:
    conn = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    q = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
    out = {"cells": q("SELECT COUNT(*) FROM cells"), "calls": q("SELECT COUNT(*) FROM calls"),
           "models": q("SELECT COUNT(DISTINCT json_extract(coords, '$.model')) FROM cells"),
           "question_rows": q("SELECT SUM(json_array_length(value, '$.scored')) FROM outputs "
                              "WHERE node = 'oracles'"),
           "store_mb": (run_dir / "run.sqlite").stat().st_size / 2**20}
    conn.close()
    return out


def report(run_dir: Path) -> dict:
    """`biaslab report RUN` in a fresh process: its own peak RSS and the wall time."""
    shutil.rmtree(run_dir / "tables", ignore_errors=True)
    shutil.rmtree(run_dir / "figures", ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.Popen([_biaslab(), "report", str(run_dir)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"biaslab report failed ({proc.returncode}):\n{stderr[-3000:]}")
    return {"wall_s": wall, "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/roleplay-report-bench",
                        help="where the store is built (default %(default)s)")
    parser.add_argument("--models", type=int, default=5, help="model copies (default 5)")
    parser.add_argument("--per-stratum", type=int, default=None,
                        help="a stratified sample instead of the whole bank (a quick look)")
    parser.add_argument("--reuse", action="store_true", help="keep the store already built")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    run_dir = Path(args.dir) / "run"
    if args.reuse and (run_dir / "run.sqlite").exists():
        built = {"run_s": float("nan"), "copy_s": float("nan"), **counts(run_dir)}
    else:
        built = build(run_dir, args.per_stratum, args.models)
    print(f"store: {built['cells']:,} cells, {built['calls']:,} call records, "
          f"{built['question_rows']:,} question rows ({built['models']} models, "
          f"{3 * built['question_rows']:,} answers), {built['store_mb']:,.0f} MiB; "
          + ("reused" if args.reuse else f"scripted run {built['run_s']:.0f} s, copies "
             f"{built['copy_s']:.0f} s"), flush=True)
    result = report(run_dir)
    line = (f"biaslab report: {result['wall_s']:.0f} s wall, {result['cpu_s']:.0f} s CPU, "
            f"peak RSS {result['peak_rss_gb']:.2f} GB (targets: {TARGET_WALL_S:.0f} s, "
            f"{TARGET_RSS_GB:.0f} GB)")
    print(line)
    if args.no_write or args.per_stratum:
        return 0
    sys.path.insert(0, str(BENCH_DIR))
    from machine import describe
    load = os.getloadavg()
    section = "\n".join([
        SECTION, "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {describe(('pandas', 'numpy'))}",
        f"- command: `python bench/roleplay_report_scale.py{' --reuse' if args.reuse else ''}`"
        f" (load average at end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f})",
        "- store: one scripted run of the whole bank (clean arm, 3 repeats, both variants, "
        "classifier), copied in SQL to 5 model names; `biaslab report` in a fresh process, "
        "peak RSS = its own ru_maxrss", "",
        "```",
        f"store: {built['cells']:,} cells, {built['calls']:,} call records, "
        f"{built['question_rows']:,} question rows ({3 * built['question_rows']:,} answers), "
        f"{built['store_mb']:,.0f} MiB",
        line, "```", ""])
    write_section(SECTION, section)
    print(f"wrote {BENCH_DIR / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
