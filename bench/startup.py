"""CPU that a fresh `biaslab` process spends before and around its work: start-up (issue 48).

    python bench/startup.py                               # this tree, 5 processes per command
    python bench/startup.py --tree /tmp/base --tree .     # two checkouts, interleaved; ratios
    python bench/startup.py --tree /tmp/base --tree . --write   # also bench/results.md

Every `biaslab` command starts a new Python process that imports before it works; the test
suite starts hundreds of them. Each figure is the user+system CPU of one fresh process
(`getrusage` of the finished child; CPU rather than wall time, since the 2 cores are shared),
the median of `--repeats` processes. With two trees the processes alternate between them, so a
change of load hits both alike, and the table gives the second tree's CPU over the first's.
Each tree runs with this interpreter, `PYTHONPATH` set to the tree and `BIASLAB_CACHE=off`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import describe  # noqa: E402
from results_file import write_section  # noqa: E402

HEADING = "## CLI start-up (issue 48)"

# label -> arguments after `python -c ...` / `python -m biaslab`; {out} is a fresh directory
COMMANDS: dict[str, list[str]] = {
    "import biaslab.cli": ["-c", "import biaslab.cli"],
    "biaslab --help": ["-m", "biaslab", "--help"],
    "biaslab (bad argument, exit 2)": ["-m", "biaslab", "run", "--no-such-flag"],
    "biaslab protocols": ["-m", "biaslab", "protocols"],
    "biaslab estimate review smoke": ["-m", "biaslab", "estimate",
                                      "experiments/examples/review.toml", "--scale", "smoke"],
    # a quick scripted run (36 calls); roleplay's smoke job takes ~90 s of CPU, too long here
    "biaslab run review smoke": ["-m", "biaslab", "run", "experiments/examples/review.toml",
                                 "--model", "scripted:review-synthetic", "--scale", "smoke",
                                 "--out", "{out}", "--quiet", "--no-report"],
}


def cpu_of(tree: Path, args: list[str]) -> float:
    """User+system CPU seconds of one fresh process running `args` in `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree), BIASLAB_CACHE="off")
    with tempfile.TemporaryDirectory(prefix="biaslab-startup-") as tmp:
        argv = [sys.executable, *(a.replace("{out}", str(Path(tmp) / "run")) for a in args)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    expected = 2 if "--no-such-flag" in args else 0
    if proc.returncode != expected:
        raise SystemExit(f"{' '.join(args)} in {tree}: exit {proc.returncode}\n{proc.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, action="append",
                    help="a checkout to measure (repeatable; default: this tree)")
    ap.add_argument("--label", action="append", default=[],
                    help="name of each --tree in the table (default: its folder's name)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="replace the section in results.md")
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    labels = [args.label[i] if i < len(args.label) else t.name for i, t in enumerate(trees)]
    load0 = os.getloadavg()[0]
    medians: dict[str, list[float]] = {}
    for name, cmd in COMMANDS.items():
        runs: list[list[float]] = [[] for _ in trees]
        for _ in range(args.repeats):
            for i, tree in enumerate(trees):  # interleaved: load changes hit every tree alike
                runs[i].append(cpu_of(tree, cmd))
        medians[name] = [statistics.median(r) for r in runs]
        print(f"{name}: " + ", ".join(f"{lab} {m:.2f} s" for lab, m in
                                      zip(labels, medians[name])), file=sys.stderr)
    width = max(len(n) for n in COMMANDS)
    head = f"{'command':<{width}} | " + " | ".join(f"{lab:>10}" for lab in labels)
    if len(trees) == 2:
        head += f" | {labels[1]} / {labels[0]}"
    lines = [head, "-" * len(head)]
    for name, m in medians.items():
        row = f"{name:<{width}} | " + " | ".join(f"{v:>8.2f} s" for v in m)
        if len(trees) == 2:
            row += f" | {m[1] / m[0]:.2f}"
        lines.append(row)
    load1 = os.getloadavg()[0]
    table = "\n".join(lines)
    print(table)
    if args.write:
        section = (f"{HEADING}\n\n- machine: {describe()}\n"
                   f"- command: `python bench/startup.py "
                   + " ".join(f"--tree {t}" for t in (args.tree or [])) +
                   f"` (load average {load0:.1f} at start, {load1:.1f} at end)\n"
                   f"- user+system CPU of one fresh process, median of {args.repeats}; "
                   f"trees interleaved\n\n```\n{table}\n```\n")
        write_section(HEADING, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
