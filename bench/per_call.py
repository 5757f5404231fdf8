"""Issue 33, items 1 and 2: CPU per call and throughput at 128 and 256 calls in flight.

``python bench/per_call.py [--before DIR] [--rounds N] [--no-write]``

Every figure comes from fresh processes, before and after interleaved in each round (``--before
DIR`` puts that checkout's biaslab first on PYTHONPATH), so both columns see the same machine:

- **warm**: CPU per call of a 2,000-cell run of one-call cells (scripted model, zero latency,
  C = 16, default packing) in a process that ran the grid once before (the median of 5 runs;
  `bench/scale.py --measure cpu`), with ``BIASLAB_CACHE=off`` and with a fresh shared cache
  file (what a user's run writes by default);
- **CLI**: ``biaslab run SPEC --workers 1 --quiet --no-report`` as a user types it, twice, at
  2,000 and 20,000 cells; the marginal CPU per call, (CPU(20,000) − CPU(2,000)) / 18,000, leaves
  out what a command pays once (imports, plan, store set-up);
- **C = 128 / 256** at 50 ms: achieved / ideal calls per second, where ideal = C / 50 ms, beside a
  plain asyncio loop making the same sleeps (`bench/scale.py --measure conc`).

The machine note gives the load average and the share of CPU time the hypervisor took from this
VM ("steal", from /proc/stat) while the bench ran: with steal, absolute figures are high and the
interleaved before/after ratio is the one to read. Results go to the "Per-call CPU" section of
bench/results.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
SECTION = "## Per-call CPU and throughput at 128 in flight (`bench/per_call.py`, issue 33)"
sys.path.insert(0, str(BENCH_DIR))

from results_file import write_section  # noqa: E402


def _cpu_stat() -> tuple[int, int]:
    """(all jiffies, steal jiffies) of the whole machine so far."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields[:8]), fields[7]


def _env(path: str | None, cache: str | None = "off") -> dict[str, str]:
    env = dict(os.environ)
    tree = path or str(ROOT)
    env["PYTHONPATH"] = os.pathsep.join([tree, str(BENCH_DIR), env.get("PYTHONPATH", "")])
    if cache is not None:
        env["BIASLAB_CACHE"] = cache
    return env


def measure(path: str | None, *args: str, cache: str | None = "off") -> dict:
    """One `bench/scale.py --measure` in a fresh process of the tree at `path`."""
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "scale.py"), "--measure", *args],
                          capture_output=True, text=True, env=_env(path, cache),
                          cwd=path or ROOT, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"{args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def warm_shared(path: str | None) -> float:
    """`measure cpu flat`, with a shared cache file of its own (empty at the start)."""
    code = ("import sys; sys.argv=['x']; import scale, json, os, time, asyncio, shutil, "
            "tempfile; from pathlib import Path\n"
            "from biaslab.experiments.runner import run_plan\n"
            "plan = scale._flat_plan(2000)\n"
            "def go(i):\n"
            "    d = Path(tempfile.mkdtemp()); os.environ['BIASLAB_CACHE'] = "
            "str(d / 'shared.sqlite')\n"
            "    t = time.process_time()\n"
            "    r = asyncio.run(run_plan(plan, d / 'run', concurrency=16, "
            "use_shared_cache=True, progress=False))\n"
            "    dt = time.process_time() - t; shutil.rmtree(d)\n"
            "    return dt / r.counters.calls * 1e3\n"
            "go(0)\n"
            "print(json.dumps(sorted(go(i) for i in range(5))[2]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(path, None), cwd=BENCH_DIR, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cli_cpu(path: str | None, cells: int) -> float:
    """CPU seconds of one ``biaslab run`` (children included) of `cells` one-call cells."""
    import flat_protocol

    scratch = Path(tempfile.mkdtemp(prefix="biaslab-percall-"))
    try:
        data = flat_protocol.flat_spec_dict(cells // 2)
        data["protocol"] = "flat_protocol:Flat"
        data["models"] = ["scripted:flat_protocol:make_echo"]
        data["run"] = {"seeds": [1], "concurrency": 16}
        spec = scratch / "flat.toml"
        spec.write_text(tomli_w.dumps(data))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "biaslab", "run", str(spec), "--out",
                        str(scratch / "run"), "--workers", "1", "--quiet", "--no-report"],
                       check=True, env=_env(path), cwd=scratch, timeout=900,
                       stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a checkout measured as 'before'")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    arms = [("before", args.before), ("after", None)] if args.before else [("after", None)]
    results: dict[tuple[str, str], list[float]] = {}
    lines: list[str] = []

    def add(label: str, what: str, value: float) -> None:
        results.setdefault((label, what), []).append(value)

    started, (all0, steal0), load0 = time.perf_counter(), _cpu_stat(), os.getloadavg()[0]
    for round_ in range(args.rounds):
        for label, path in arms:
            add(label, "warm, no shared cache",
                measure(path, "cpu", "flat", "2000", "0")["cpu_ms_per_call"])
            add(label, "warm, fresh shared cache", warm_shared(path))
            small, large = cli_cpu(path, 2000), cli_cpu(path, 20000)
            add(label, "CLI marginal", (large - small) / 18000 * 1e3)
            for c in ("128", "256"):
                r = measure(path, "conc", c, "8000")
                add(label, f"C={c} achieved/ideal", r["ratio"])
                add(label, f"C={c} plain loop", r["plain_ratio"])
        lines.append(f"round {round_ + 1}: " + "; ".join(
            f"{label} {what} {values[-1]:.3f}" for (label, what), values in results.items()))
        print(lines[-1], flush=True)
    all1, steal1 = _cpu_stat()
    steal = (steal1 - steal0) / max(1, all1 - all0)
    whats = list(dict.fromkeys(what for _, what in results))
    header = ["measure", *(label for label, _ in arms)]
    if args.before:
        header.append("after / before")
    rows = []
    for what in whats:
        medians = [statistics.median(results[(label, what)]) for label, _ in arms]
        unit = " ms" if "ideal" not in what and "plain" not in what else ""
        row = [f"{what}" + (" (CPU per call)" if unit else ""),
               *(f"{m:.3f}{unit}" for m in medians)]
        if args.before:
            row.append(f"{medians[1] / medians[0]:.2f}")
        rows.append(row)
    width = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    table = "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, width)).rstrip()
                      for r in [header, *rows])
    print("\n" + table)
    from machine import describe

    load = os.getloadavg()
    section = "\n".join([
        SECTION, "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {describe(('langgraph', 'langchain-core'))}",
        f"- machine state: load average {load0:.1f} at start, {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at end; steal {steal:.0%} of the machine's CPU time over the bench",
        f"- command: `python bench/per_call.py{' --before DIR' if args.before else ''} --rounds "
        f"{args.rounds}` ({time.perf_counter() - started:.0f} s); each figure the median of "
        f"{args.rounds} rounds, before and after interleaved in each round, every measurement "
        "in a fresh process", "", "```", table, "```", "", "```", *lines, "```", ""])
    if not args.no_write:
        write_section(SECTION, section)
        print(f"wrote {BENCH_DIR / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
