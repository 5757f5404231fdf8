"""A million call records end to end: ``biaslab run --workers 2`` then ``biaslab report`` (issue 22).

    python bench/million_calls.py                     # ~1,000,000 call records; writes results.md
    python bench/million_calls.py --calls 20000       # a quick check of the same path
    python bench/million_calls.py --calls 20000 --no-write --keep

The grid is the roleplay protocol, run by scripted synthetic targets at zero latency
(``scripted:roleplay-synthetic`` with different injected effects, so each is a distinct model;
the same model answers as the Why judges and the bias-type classifier). Roleplay reaches a
million call records with the protocol's real work in every cell: a cell is a chunk of bank
questions, asked 3 times with and without the role, judged, voted, classified. It is sized
from the plan (what ``biaslab estimate`` prints): as few models as hold `--calls`, each on the
same stratified sample of the bank (``per_stratum``), the smallest sample that reaches it.

Then, each in a fresh subprocess, exactly as a user types them:

1. ``biaslab run SPEC --out DIR --workers 2 --quiet --no-report``, with ``BIASLAB_CACHE`` at a
   fresh temporary file (a user's default: the cross-run cache is written too, and being empty
   it answers nothing, so every call reaches the scripted model), or ``off`` with ``--cache off``;
   ``--no-report`` so that the report is timed on its own:
2. ``biaslab report DIR``.

Measured: wall time (``perf_counter``), CPU (``os.wait4`` of the process: its own time plus that
of its waited-for children, i.e. the workers; checked against ``RUSAGE_CHILDREN`` deltas), peak
RSS (the ``ru_maxrss`` of ``wait4``, which is the *largest single process* of the tree, not a
sum; beside it each process's own VmHWM and the peak of the tree's summed RSS, sampled from
/proc every 0.2 s), the run directory's peak disk use (sampled) and final store size, and the
cells and call records counted in the store with SQL.

From these, the cost of every shipped paper-scale grid (``experiments/*.toml``) on a real
endpoint at 10, 50 and 200 requests/s: model time = calls / rate; the local CPU floor = calls ×
the measured CPU per call record / the 2 workers; whichever is larger bounds the run.

Nothing here is a test; the result goes to its own section of bench/results.md
(`results_file.write_section`), or is only printed with ``--no-write``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from machine import describe  # siblings: bench/ is on sys.path when run as a script
from results_file import write_section

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SECTION = "## A million calls end to end (`bench/million_calls.py`)"
WORKERS = 2
RATES = (10, 50, 200)
LATENCY_S = 2.0
"""Seconds per call assumed for the concurrency a rate needs (``biaslab estimate``'s default)."""
BASE = "scripted:roleplay-synthetic"
EFFECTS = ("", "@role=0.5,no_role=0.1", "@role=0.3", "@role=0.7,no_role=0.2",
           "@role=0.2,no_role=0.05", "@role=0.6,no_role=0.3")
"""One distinct scripted target per effect (the bare name: the per-attribute defaults)."""


def _biaslab() -> str:
    exe = Path(sys.executable).with_name("biaslab")
    return str(exe) if exe.exists() else "biaslab"


# -- the grid -----------------------------------------------------------------------------------

def spec_text(models: int, per_stratum: int | None) -> str:
    names = ", ".join(f'"{BASE}{e}"' for e in EFFECTS[:models])
    sample = f"per_stratum = {per_stratum}\n" if per_stratum else ""
    return ('name = "million-calls"\nprotocol = "roleplay"\n'
            f"models = [{names}]\n[run]\nseeds = [42]\nconcurrency = 32\n"
            "[conditions]\ntargets = []\n"
            f"[options]\nrepeats = 3\nclassify_bias_types = true\n{sample}")


def estimate(spec_path: Path) -> dict:
    """What ``biaslab estimate SPEC --scale paper`` reports: cells, calls, tokens."""
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.planning import estimate_plan
    from biaslab.experiments.spec import load_spec

    report = estimate_plan(make_plan(load_spec(str(spec_path), scale="paper"), check_keys=False))
    report.pop("_by_model", None)
    return report


def size_grid(calls: int, spec_path: Path) -> tuple[int, int | None, dict]:
    """The fewest models whose whole bank holds `calls`, then the smallest per-stratum sample
    (bisection on the plan's estimate) that reaches it. Writes the chosen spec."""
    def planned(models: int, per_stratum: int | None) -> dict:
        spec_path.write_text(spec_text(models, per_stratum), encoding="utf-8")
        return estimate(spec_path)

    whole = planned(1, None)["calls_estimate"]
    models = max(1, math.ceil(calls / whole))
    if models > len(EFFECTS):
        print(f"--calls {calls:,}: at most {len(EFFECTS) * whole:,} call records "
              f"({len(EFFECTS)} models x the whole bank)", file=sys.stderr)
        sys.exit(2)
    lo, hi = 1, 1000   # the bank's strata hold 980-1,000 questions each
    while lo < hi:
        mid = (lo + hi) // 2
        if planned(models, mid)["calls_estimate"] >= calls:
            hi = mid
        else:
            lo = mid + 1
    per_stratum = None if lo >= 1000 else lo
    return models, per_stratum, planned(models, per_stratum)


# -- measuring a subprocess -----------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _cpu_s(pid: int) -> float | None:
    """User + system CPU of the process itself so far (/proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, keys=("VmHWM", "VmRSS")) -> dict[str, int]:
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in keys:
                    values[key] = int(line.split()[1])
    except OSError:
        pass
    return values


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class Sampler(threading.Thread):
    """Every `interval` s: each process of the tree's VmHWM, the tree's summed RSS, and the
    disk use of `paths`. The last sample before a process exits is within `interval` of it."""

    def __init__(self, pid: int, paths: list[Path], interval: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.paths, self.interval = pid, paths, interval
        self.hwm_kib: dict[int, int] = {}
        self.cpu_s: dict[int, float] = {}
        self.peak_sum_kib = 0
        self.peak_disk = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            tree, todo = [], [self.pid]
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo += _children(pid)
            rss = 0
            for pid in tree:
                s = _status_kib(pid)
                if "VmHWM" in s:
                    self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), s["VmHWM"])
                rss += s.get("VmRSS", 0)
                cpu = _cpu_s(pid)
                if cpu is not None:
                    self.cpu_s[pid] = cpu
            self.peak_sum_kib = max(self.peak_sum_kib, rss)
            self.peak_disk = max(self.peak_disk, sum(_du(p) for p in self.paths))
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.peak_disk = max(self.peak_disk, sum(_du(p) for p in self.paths))


def measured(argv: list[str], env: dict, disk: list[Path]) -> dict:
    """Run `argv` in a fresh process: wall, CPU and peak RSS of its tree, peak disk of `disk`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid, disk)
    sampler.start()
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{output[-3000:]}")
    hwm = sorted(sampler.hwm_kib.items())
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "cpu_children_delta_s": (after.ru_utime + after.ru_stime
                                     - before.ru_utime - before.ru_stime),
            "maxrss_mib": usage.ru_maxrss / 1024,
            "hwm_mib": [v / 1024 for _, v in hwm],
            "cpu_each_s": [sampler.cpu_s.get(pid, 0.0) for pid, _ in hwm], "peak_sum_mib": sampler.peak_sum_kib / 1024,
            "peak_disk_mib": sampler.peak_disk / 2**20, "output": output}


def store_counts(run_dir: Path) -> dict:
    conn = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    q = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
    out = {"cells": q("SELECT COUNT(*) FROM cells"),
           "cells_done": q("SELECT COUNT(*) FROM cells WHERE status = 'done'"),
           "calls": q("SELECT COUNT(*) FROM calls"),
           "cache_hits": q("SELECT COALESCE(SUM(cache_hit), 0) FROM calls"),
           "models": q("SELECT COUNT(DISTINCT json_extract(coords, '$.model')) FROM cells")}
    conn.close()
    out["store_mib"] = (run_dir / "run.sqlite").stat().st_size / 2**20
    return out


# -- projection ------------------------------------------------------------------------------

def paper_grids() -> list[dict]:
    """``biaslab estimate`` of each shipped spec at paper scale, with its concurrency."""
    import tomllib
    rows = []
    for path in sorted((REPO / "experiments").glob("*.toml")):
        try:
            report = estimate(path)
        except Exception as exc:  # noqa: BLE001 (a spec that needs absent data: say so, go on)
            rows.append({"spec": path.stem, "error": str(exc).splitlines()[0]})
            continue
        conc = tomllib.loads(path.read_text(encoding="utf-8")).get("run", {}).get("concurrency")
        rows.append({"spec": path.stem, "calls": report["calls_estimate"],
                     "tokens": report["tokens_estimate"], "concurrency": conc})
    return rows


def _dur(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def projection_table(rows: list[dict], cpu_per_call_s: float) -> list[str]:
    head = ("spec | calls | tokens | " + " | ".join(f"{r} rps" for r in RATES)
            + f" | local CPU ({WORKERS} workers) | bound at {RATES[-1]} rps"
            + f" | spec's concurrency: rps at {LATENCY_S:g} s a call")
    lines = [head, "|".join("---" for _ in head.split("|"))]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['spec']} | not estimated: {row['error']}")
            continue
        cpu = row["calls"] * cpu_per_call_s / WORKERS
        walls = [max(row["calls"] / r, cpu) for r in RATES]
        top = RATES[-1]
        bound = "local CPU" if cpu > row["calls"] / top else "endpoint rate"
        lines.append(f"{row['spec']} | {row['calls']:,} | {row['tokens'] / 1e6:,.0f} M | "
                     + " | ".join(_dur(w) for w in walls) + f" | {_dur(cpu)} | {bound} | "
                     + (f"{row['concurrency']} in flight: {row['concurrency'] / LATENCY_S:g}"
                        if row["concurrency"] else "default"))
    return lines


def plan_in_subprocess(calls: int, spec_path: Path) -> dict:
    """`size_grid` and `paper_grids` in a child process, so that this one never imports
    biaslab: a child's ru_maxrss starts from its parent's RSS at the fork, so a small parent
    keeps the measured processes' peak RSS their own."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--calls",
                           str(calls), "--plan-into", str(spec_path)], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode:
        print(done.stderr.strip() or done.stdout.strip(), file=sys.stderr)
        sys.exit(done.returncode)
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- main ------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000,
                        help="call records the grid should reach (default %(default)s)")
    parser.add_argument("--dir", default=None, help="where the run goes (default: a fresh "
                        "temporary directory, removed at the end)")
    parser.add_argument("--cache", choices=("fresh", "off"), default="fresh",
                        help="BIASLAB_CACHE: a fresh temporary file (default) or off")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--plan-into", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plan_into:   # the planning subprocess (see `plan_in_subprocess`)
        models, per_stratum, plan = size_grid(args.calls, Path(args.plan_into))
        print(json.dumps({"models": models, "per_stratum": per_stratum, "plan": plan,
                          "grids": paper_grids()}))
        return 0
    if args.calls < 1000:
        parser.error("--calls must be at least 1000")
    load_start = os.getloadavg()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="million-calls-"))
    base.mkdir(parents=True, exist_ok=True)
    run_dir, spec_path, cache = base / "run", base / "spec.toml", base / "cache.sqlite"
    shutil.rmtree(run_dir, ignore_errors=True)
    cache.unlink(missing_ok=True)
    try:
        planned = plan_in_subprocess(args.calls, spec_path)
        models, per_stratum, plan = planned["models"], planned["per_stratum"], planned["plan"]
        sample = f"per_stratum = {per_stratum}" if per_stratum else "the whole bank"
        print(f"grid: roleplay, {models} scripted model{'s' * (models > 1)} x {sample} (3 repeats, role/no role, "
              f"classifier): {plan['cells']:,} cells, {plan['calls_estimate']:,} planned call "
              f"records, {plan['tokens_estimate']:,} tokens", flush=True)
        env = dict(os.environ, BIASLAB_CACHE=str(cache) if args.cache == "fresh" else "off")
        run = measured([_biaslab(), "run", str(spec_path), "--out", str(run_dir), "--workers",
                        str(WORKERS), "--quiet", "--no-report"], env, [run_dir, cache])
        counts = store_counts(run_dir)
        cache_mib = cache.stat().st_size / 2**20 if cache.exists() else 0.0
        report = measured([_biaslab(), "report", str(run_dir)], env, [run_dir])
        grids = planned["grids"]
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()

    per_call_ms = 1000 * run["cpu_s"] / counts["calls"]
    rss = lambda m: (f"peak RSS {m['maxrss_mib']:,.0f} MiB (ru_maxrss: largest one process); "  # noqa: E731
                     f"per process VmHWM {', '.join(f'{v:,.0f}' for v in m['hwm_mib'])} MiB "
                     f"(CPU seen {', '.join(f'{c:,.1f}' for c in m['cpu_each_s'])} s); "
                     f"tree sum peak {m['peak_sum_mib']:,.0f} MiB")
    lines = [
        f"grid: roleplay, {models} scripted model{'s' * (models > 1)} x {sample}, 3 repeats, role and no role, "
        f"classifier; planned {plan['cells']:,} cells, {plan['calls_estimate']:,} call records",
        f"store: {counts['cells']:,} cells ({counts['cells_done']:,} done), {counts['calls']:,} "
        f"call records ({counts['calls'] - counts['cache_hits']:,} reach the model, "
        f"{counts['cache_hits']:,} are answered by the run's own cache), {counts['models']} "
        "model(s); "
        f"run.sqlite {counts['store_mib']:,.0f} MiB; run dir peak {run['peak_disk_mib']:,.0f} "
        f"MiB during the run "
        + (f"(the fresh BIASLAB_CACHE file included: {cache_mib:,.0f} MiB)"
           if args.cache == "fresh" else "(BIASLAB_CACHE=off)"),
        f"biaslab run --workers {WORKERS}: {run['wall_s']:,.1f} s wall, {run['cpu_s']:,.1f} s CPU "
        f"(RUSAGE_CHILDREN delta {run['cpu_children_delta_s']:,.1f} s) = {per_call_ms:.2f} ms "
        f"CPU per call record, {counts['calls'] / run['wall_s']:,.0f} call records/s; "
        + rss(run),
        f"biaslab report: {report['wall_s']:,.1f} s wall, {report['cpu_s']:,.1f} s CPU; "
        + rss(report),
        f"load average: {load_start[0]:.1f} / {load_start[1]:.1f} / {load_start[2]:.1f} at start, "
        f"{load_end[0]:.1f} / {load_end[1]:.1f} / {load_end[2]:.1f} at end",
    ]
    table = projection_table(grids, per_call_ms / 1000)
    print("\n".join(lines), "", *table, sep="\n")
    if args.no_write:
        return 0
    command = "python bench/million_calls.py" + (
        f" --calls {args.calls}" if args.calls != 1_000_000 else "") + (
        " --cache off" if args.cache == "off" else "")
    section = "\n".join([
        SECTION, "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {describe(('langgraph', 'pandas'))}",
        f"- command: `{command}` (load average {load_start[0]:.1f} at start, "
        f"{load_end[0]:.1f} / {load_end[1]:.1f} / {load_end[2]:.1f} at end)",
        "- `biaslab run SPEC --out DIR --workers 2 --quiet --no-report`, then `biaslab report "
        "DIR`, each in a fresh process; CPU = `os.wait4` of the process (workers included); "
        "ru_maxrss is the largest single process of the tree, VmHWM and the tree's sum are "
        "sampled from /proc every 0.2 s; the run's own cache answers repeated requests even "
        "with BIASLAB_CACHE fresh (the scripted target gives a few fixed answer texts, so many "
        "Why-judge prompts repeat)", "",
        "```", *lines, "```", "",
        f"Paper-scale grids on a real endpoint (`biaslab estimate --scale paper`): model time = "
        f"calls / rate; local CPU = calls x {per_call_ms:.2f} ms (measured above, scripted "
        f"roleplay, no HTTP client) / {WORKERS} workers; the wall time is the larger. A rate R "
        f"needs R x latency calls in flight (400 at {LATENCY_S:g} s a call for 200 rps), "
        "above every shipped spec's `concurrency`: raise it with `--concurrency`. At this CPU "
        f"per call the {WORKERS} workers would bind only above "
        f"{WORKERS * 1000 / per_call_ms:,.0f} requests/s; an HTTP client adds its own CPU per "
        "call (the `[http]` line of `bench/scale.py`).", "",
        *table, ""])
    write_section(SECTION, section)
    print(f"wrote {BENCH_DIR / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
