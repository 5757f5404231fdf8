"""E2's CPU per call record in a fresh process, as `biaslab run` pays it, beside the warm
figure (after a warm-up run of the same grid), measured in one run of this script.

    python bench/fresh_process.py          # ~1-2 min; writes its section of bench/results.md

The fresh figure includes every first-time cost of the run (data split, the ML predictor's
fit per split, graph compilation), but not interpreter start-up and imports. The grid is
bench/scale.py's E2 grid: 16 seeds (16 splits), 240 cells, 1,180 call records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe  # noqa: E402
from results_file import write_section  # noqa: E402
from scale import measure  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    fresh = sorted(measure("cpu-fresh", "e2", 0)["cpu_ms_per_call"] for _ in range(5))
    warm = measure("cpu", "e2", 0, 0)
    lines = [
        f"- E2, fresh process: {fresh[2]:.2f} ms CPU per call record (median of 5 processes, "
        f"range {fresh[0]:.2f}-{fresh[-1]:.2f}); target <= 1 ms",
        f"- E2, warm (median of 5 runs after a warm-up run): {warm['cpu_ms_per_call']:.2f} ms",
        f"- fresh / warm: {fresh[2] / warm['cpu_ms_per_call']:.1f}x "
        f"({warm['calls']} call records, {warm['cells']} cells, 16 data splits: one fit each)",
    ]
    for line in lines:
        print(line)
    if not args.no_write:
        write_section("## E2 in a fresh process", "## E2 in a fresh process\n\n"
                      f"Machine: {describe(('scikit-learn', 'langgraph'))}.\n"
                      "Command: `python bench/fresh_process.py`.\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
