"""Ctrl-C at random moments of the first 3 s of ``biaslab run``, ``report`` and ``export``:
``python bench/ctrl_c_loop.py --runs 50`` (about 10 minutes on a loaded 2-core machine),
through the ``biaslab`` command as pip installs it (the launcher scripts/biaslab and the
``_biaslab`` entry point).

Each try must end with exit 130 and one line (tests/support_ctrl_c.py says how a try is
judged); the test tests/test_ctrl_c_start.py runs the same loop with a few tries per verb.
Prints one line per problem and a summary; exits 1 if any try went wrong (a death by the
signal without a word in the first 0.1 s, which may be the launcher's own start, included).
Run it with ``PYTHONFAULTHANDLER=1`` set or not: every try sets it, so a crash prints its
stack."""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import support_ctrl_c  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="tries per verb (default 50)")
    parser.add_argument("--window", type=float, default=3.0, help="seconds (default 3)")
    parser.add_argument("--from", dest="from_s", type=float, default=0.0,
                        help="earliest moment, seconds (default 0)")
    parser.add_argument("--verbs", default="run,report,export", help="comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="biaslab-ctrl-c-") as root:
        tries = support_ctrl_c.loop(Path(root), args.runs, window_s=args.window, seed=args.seed,
                                   verbs=args.verbs.split(","), from_s=args.from_s)
    counts = collections.Counter()
    for t in tries:
        kind = ("finished first" if t.finished_first
                else "ended as the signal came (exit 0)" if t.ended_as_signalled
                else "problem: died in the launcher's start?" if t.in_launcher_start
                else "problem" if t.problem else "exit 130, one line")
        counts[(t.verb, kind)] += 1
        if t.problem:
            print(f"PROBLEM {t.verb} at {t.at_s:.2f} s: {t.problem}: {t.stderr[-400:]!r}")
    for (verb, kind), n in sorted(counts.items()):
        print(f"{verb:7} {kind:30} {n}")
    return 1 if any(t.problem for t in tries) else 0


if __name__ == "__main__":
    sys.exit(main())
