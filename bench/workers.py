"""`biaslab run --workers 2` against one process, as a user runs both (issue 22, item 2).

    python bench/workers.py                    # ~5 min on 2 idle cores; writes its section of results.md
    python bench/workers.py --sizes 2000 20000 --repeats 1 --no-write

Each measurement is one `biaslab run SPEC --out DIR --quiet --no-report` in a fresh process
(interpreter start-up, imports, the plan, the run, the workers and their merge all included),
on the scripted model at zero latency, where the work is CPU-bound: one-call cells of
``bench-flat`` at several grid sizes, and the amplification E2 grid of bench/scale.py (16
seeds, 240 cells, 1,180 call records). `--workers 1` and `--workers 2` alternate, and each
figure is the median of `--repeats` runs. The response cache is off, so both pay every call.

The ratio is T(1 process) / T(2 workers): above 1, the workers pay off. The break-even is the
grid size where the ratio crosses 1, interpolated between the two sizes around it; the
default (`--workers auto`) starts workers on scripted models from
`biaslab.experiments.workers.BREAK_EVEN_CELLS` cells, which this bench is how to choose.
Wall times on 2 shared cores swing; the load average is printed with each run, and the ratio
of runs taken alternately is what to read.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe  # noqa: E402
from results_file import write_section  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
SECTION = "## --workers 2 against one process (`bench/workers.py`)"
SIZES = (500, 1000, 2000, 5000, 20000)


def _biaslab() -> str:
    exe = Path(sys.executable).with_name("biaslab")
    return str(exe) if exe.exists() else "biaslab"


def flat_spec(cells: int) -> dict:
    """`cells` one-call cells: half clean, half exposed (two conditions per item)."""
    return {"name": f"bench-workers-{cells}", "protocol": "flat_protocol:Flat",
            "models": ["scripted:flat_protocol:make_echo"],
            "prompt_overrides": [str(BENCH_DIR / "prompts")],
            "conditions": {"directions": ["pro_a"]}, "options": {"n_items": max(1, cells // 2)},
            "run": {"seeds": [1]}}


def e2_spec() -> dict:
    return {"name": "bench-workers-e2", "protocol": "amplification",
            "models": ["scripted:amplification-synthetic"],
            "run": {"seeds": list(range(1, 17))},
            "conditions": {"directions": ["pro_female", "pro_male"]},
            "options": {"datasets": ["math"], "pipelines": ["E2"], "max_test": 20,
                        "n_resamples": 200}}


def one_run(spec_file: Path, workers: int) -> dict:
    """Wall and CPU (this process and its children) of one `biaslab run`."""
    out = Path(tempfile.mkdtemp(prefix="biaslab-workers-")) / "run"
    env = dict(os.environ, BIASLAB_CACHE="off",
               PYTHONPATH=os.pathsep.join([str(BENCH_DIR), os.environ.get("PYTHONPATH", "")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([_biaslab(), "run", str(spec_file), "--out", str(out), "--quiet",
                           "--no-report", "--workers", str(workers)], env=env,
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(out.parent, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"biaslab run --workers {workers} failed:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load": os.getloadavg()[0]}


def compare(spec: dict, repeats: int, where: Path) -> dict:
    spec_file = where / f"{spec['name']}.toml"
    spec_file.write_text(tomli_w.dumps(spec))
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(repeats):
        for workers in (1, 2):
            runs[workers].append(one_run(spec_file, workers))
    med = {w: statistics.median(r["wall_s"] for r in rs) for w, rs in runs.items()}
    cpu = {w: statistics.median(r["cpu_s"] for r in rs) for w, rs in runs.items()}
    return {"t1": med[1], "t2": med[2], "cpu1": cpu[1], "cpu2": cpu[2],
            "ratio": med[1] / med[2],
            "loads": [round(r["load"], 1) for rs in runs.values() for r in rs]}


def break_even(rows: list[tuple[int, float]]) -> str:
    """The size where T1/T2 crosses 1, interpolated on log size between the sizes around it."""
    import math

    for (n0, r0), (n1, r1) in zip(rows, rows[1:]):
        if r0 < 1 <= r1:
            x = math.log(n0) + (1 - r0) / (r1 - r0) * (math.log(n1) - math.log(n0))
            return f"about {math.exp(x):,.0f} cells (between {n0:,} and {n1:,})"
    if rows and rows[0][1] >= 1:
        return f"below {rows[0][0]:,} cells (the smallest size measured already gains)"
    return "not reached at the sizes measured"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-e2", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    lines, rows = [], []
    with tempfile.TemporaryDirectory() as where:
        for n in sorted(args.sizes):
            r = compare(flat_spec(n), args.repeats, Path(where))
            rows.append((n, r["ratio"]))
            lines.append(f"one-call cells, N = {n:>6,}: 1 process {r['t1']:6.2f} s, --workers 2 "
                         f"{r['t2']:6.2f} s -> {r['ratio']:.2f}x  (CPU {r['cpu1']:.1f} s vs "
                         f"{r['cpu2']:.1f} s; load {r['loads']})")
            print(lines[-1], flush=True)
        if not args.no_e2:
            r = compare(e2_spec(), args.repeats, Path(where))
            lines.append(f"E2 (240 cells, 1,180 call records, 16 splits): 1 process "
                         f"{r['t1']:.2f} s, --workers 2 {r['t2']:.2f} s -> {r['ratio']:.2f}x  "
                         f"(CPU {r['cpu1']:.1f} s vs {r['cpu2']:.1f} s; load {r['loads']})")
            print(lines[-1], flush=True)
    lines.append(f"break-even (one-call cells): {break_even(rows)}")
    print(lines[-1])
    if not args.no_write:
        took = time.perf_counter() - started
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        write_section(SECTION, f"{SECTION}\n\n"
                      f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
                      f"- machine: {describe(('langgraph',))}\n"
                      f"- command: `python bench/workers.py {' '.join(argv or sys.argv[1:])}`"
                      f" ({took:.0f} s; load average at end {load})\n"
                      f"- each figure: median of {args.repeats} whole `biaslab run` commands in "
                      "fresh processes, 1 and 2 workers alternating, scripted model at zero "
                      "latency, no response cache, `--no-report`\n\n"
                      "```\n" + "\n".join(lines) + "\n```\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
