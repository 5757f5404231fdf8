"""Where the test suite's CPU goes: a summary of a py-spy profile of `make test` (issue 48).

Why: `make test` must fit 10 minutes on 2 idle cores, and per-test durations (pytest
--durations) say which tests are long, not what in them costs: imports in every `biaslab`
process a test starts, reports a run writes whether or not the test reads them, figures. A
sampling profile of the whole suite, workers and their child processes, answers that.

Record (py-spy is not a dependency: install it anywhere, e.g. `pip install --target /tmp/pyspy
py-spy`), then summarise:

    PYTHONPATH=/tmp/pyspy /tmp/pyspy/bin/py-spy record --subprocesses --rate 25 --format raw \\
        --output /tmp/suite.raw --nonblocking -- .venv/bin/python -m pytest -q -n 2 \\
        --dist loadfile --no-loadscope-reorder
    python bench/suite_profile.py /tmp/suite.raw

Each line of a raw profile is one stack (frames joined by ';', outermost first, beginning
with one `process PID:"command"` frame per process level) and its sample count. A share is the
part of all samples whose stack holds the frame: shares overlap (a figure saved inside a report
counts in both).
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Iterator

FRAMES = {
    "a report written (write_reports)": "write_reports (",
    "an import (any module)": "_find_and_load (",
    "a figure saved (Figure.savefig)": "Figure.savefig (",
    "  of which a tight bounding box": "get_tightbbox (",
    "  of which PNG": "print_png (",
    "  of which SVG": "print_svg (",
    "pandas": "pandas/",
    "an SQLite statement": "execute (",
    "scikit-learn": "sklearn/",
    "Ray": "ray/",
}


def stacks(path: str) -> Iterator[tuple[list[str], int]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if count.isdigit():
                yield stack.split(";"), int(count)


def summary(path: str, top: int = 15) -> str:
    total = 0
    shares: collections.Counter[str] = collections.Counter()
    kind: collections.Counter[str] = collections.Counter()
    kind_import: collections.Counter[str] = collections.Counter()
    commands: collections.Counter[str] = collections.Counter()
    reports_by: collections.Counter[str] = collections.Counter()
    for frames, n in stacks(path):
        total += n
        joined = ";".join(frames)
        for name, frame in FRAMES.items():
            if frame in joined:
                shares[name] += n
        processes = [f for f in frames if f.startswith("process ")]
        # pytest, then its xdist worker: deeper levels are processes the tests started
        where = "test workers" if len(processes) <= 2 else "processes the tests start"
        kind[where] += n
        if "_find_and_load (" in joined:
            kind_import[where] += n
        if where == "processes the tests start":
            command = processes[-1].split(":", 1)[1].strip('"')
            command = re.sub(r"/tmp/\S+", "TMP", command)
            words = command.split()
            commands[" ".join(words[1:4]) if len(words) > 1 else command] += n
        if "write_reports (" in joined:
            verb = next((f.split(" (")[0] for f in frames if f.startswith("cmd_")), "(API)")
            reports_by[f"{where}: {verb}"] += n

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    out = [f"{total} samples"]
    out += [f"{pct(shares[name])}  {name}" for name in FRAMES]
    out.append("")
    for where in kind:
        out.append(f"{pct(kind[where])}  in {where} (imports: "
                   f"{100 * kind_import[where] / kind[where]:.0f}% of it)")
    out.append("\nreports, by where and which verb wrote them:")
    out += [f"{pct(n)}  {k}" for k, n in reports_by.most_common()]
    out.append(f"\nthe {top} costliest commands the tests start:")
    out += [f"{pct(n)}  {k[:100]}" for k, n in commands.most_common(top)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", help="a py-spy profile recorded with --format raw")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    print(summary(args.raw, args.top))


if __name__ == "__main__":
    main()
