"""The demo's amplification smoke job on idle cores and beside four CPU-bound processes (issue 48).

Why: `make demo` is a newcomer's first command, often on a laptop or CI runner that other
programs keep busy. At 7ffdeef the embedded model's two llama.cpp threads spin-waited against
such programs and the job's calls timed out and restarted from zero (`retry 3`, 1 call in 13
minutes). This bench runs the job as `make demo` does (a fresh process, an empty cache, no
``BIASLAB_LOCAL_*`` setting), once alone and once beside four ``python3 -c 'while True: pass'``
processes, and prints wall time, model calls and retries for each.

    python bench/demo_load.py                       # this tree, idle then loaded
    python bench/demo_load.py --tree /tmp/base      # another checkout (e.g. 7ffdeef) with this venv
    python bench/demo_load.py --tree /tmp/base --tree . --limit 600 --write
        # before and after in one run (each idle, then loaded), into bench/results.md
    python bench/demo_load.py --spec experiments/augmentation.toml
        # another of the demo's jobs (its ratio, not the section --write replaces)

A run that passes ``--limit`` is stopped and reported with the last progress line it printed
(cells done, calls, retries), so a collapsing configuration does not hold the bench for hours.
The figures depend on what else the machine runs: the load average is printed beside each.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import describe  # noqa: E402
from results_file import write_section  # noqa: E402

SPEC = "experiments/amplification_math.toml"
SPINNERS = 4
HEADING = "## The demo's amplification job, idle and loaded (`bench/demo_load.py`, issue 48)"
_SUMMARY = re.compile(r"(\d+) model calls, (\d+) cache hits, (\d+) retries")
_STATUS = re.compile(r"calls ([\d,]+) .*retry (\d+)")


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def run_job(tree: Path, limit_s: float, extra_env: dict[str, str] | None = None,
            extra_args: tuple[str, ...] = (), spec: str = SPEC) -> dict:
    """One smoke run of `spec` (default: the amplification job) in a fresh process; wall,
    calls, retries."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BIASLAB_LOCAL_")}
    env.update(PYTHONPATH=str(tree), BIASLAB_CACHE="off", PYTHONUNBUFFERED="1",
               **(extra_env or {}))
    with tempfile.TemporaryDirectory(prefix="demo-load-") as out:
        cmd = [sys.executable, "-m", "biaslab.cli", "run", str(tree / spec), "--scale", "smoke",
               "--out", str(Path(out) / "run"), *extra_args]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=limit_s)
            finished = proc.returncode == 0
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            finished = False
        wall = time.monotonic() - start
    summary = _SUMMARY.search(text)
    if summary:
        calls, retries = int(summary.group(1)), int(summary.group(3))
    else:  # stopped: the last status line printed (every 15 s off a terminal)
        status = _STATUS.findall(text)
        calls, retries = ((int(status[-1][0].replace(",", "")), int(status[-1][1]))
                          if status else (0, 0))
    last = [line for line in text.splitlines() if line.strip()][-2:]
    return {"wall_s": wall, "finished": finished, "rc": proc.returncode, "calls": calls,
            "retries": retries, "load": _load(), "tail": " | ".join(last)[:300]}


def loaded(fn):
    """Run `fn()` beside `SPINNERS` CPU-bound processes (stopped afterwards, by their ids)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(SPINNERS)]
    try:
        time.sleep(1.0)
        return fn()
    finally:
        for proc in spinners:
            proc.kill()
        for proc in spinners:
            proc.wait()


def _line(label: str, r: dict) -> str:
    state = "done" if r["finished"] else f"STOPPED (rc {r['rc']})"
    return (f"{label:<28} {r['wall_s']:7.1f} s  {state:<16} calls {r['calls']:>3}  "
            f"retries {r['retries']:>2}  load avg after {r['load']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, action="append",
                    help="checkout whose biaslab and experiments/ run (default: this one; "
                         "repeatable: each in turn)")
    ap.add_argument("--label", action="append", default=[],
                    help="name of each --tree in the output (default: its folder's name)")
    ap.add_argument("--limit", type=float, default=900.0, help="stop a run after this many s")
    ap.add_argument("--only", choices=("idle", "loaded"), help="run one condition only")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set for the job, e.g. BIASLAB_LOCAL_INSTANCES=4 (repeatable)")
    ap.add_argument("--concurrency", type=int, help="the job's calls in flight (default: spec's)")
    ap.add_argument("--spec", default=SPEC,
                    help=f"the demo job to run, relative to the tree (default: {SPEC})")
    ap.add_argument("--write", action="store_true",
                    help=f"replace the section '{HEADING[3:]}' in bench/results.md")
    args = ap.parse_args(argv)
    if any("=" not in pair for pair in args.env):
        ap.error("--env takes KEY=VALUE")
    if args.write and args.spec != SPEC:
        ap.error("--write records the amplification job only")
    extra_env = dict(pair.split("=", 1) for pair in args.env)
    extra_args = ("--concurrency", str(args.concurrency)) if args.concurrency else ()
    lines = [f"machine: {describe(('xllamacpp',))}", f"load average before {_load()}"]
    print("\n".join(lines), flush=True)
    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    for i, tree in enumerate(trees):
        label = args.label[i] if i < len(args.label) else tree.name
        if args.spec != SPEC:
            label += f" {Path(args.spec).stem}"
        if extra_env or extra_args:
            label += " " + " ".join([*args.env, *extra_args])
        lines += _conditions(tree, label, args, extra_env, extra_args)
    if args.write:
        write_section(HEADING, HEADING + "\n\n```\n" + "\n".join(lines) + "\n```\n")
    return 0


def _conditions(tree: Path, label: str, args, extra_env, extra_args) -> list[str]:
    lines = []
    for cond in ("idle", "loaded"):
        if args.only and cond != args.only:
            continue

        def job():
            return run_job(tree, args.limit, extra_env, extra_args, args.spec)

        r = job() if cond == "idle" else loaded(job)
        what = "alone" if cond == "idle" else f"beside {SPINNERS} CPU-bound"
        lines.append(_line(f"{label}, {what}", r))
        print(lines[-1], flush=True)
        if not r["finished"]:
            lines.append(f"  last output: {r['tail']}")
            print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
