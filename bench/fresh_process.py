"""E2's CPU per call record in a fresh process, as `biaslab run` pays it, beside the warm
figure (after a warm-up run of the same grid), measured in one run of this script.

    python bench/fresh_process.py          # ~2 min; writes its section of bench/results.md

Two fresh figures, each the median of 5 new processes:

- cold: no fitted results on disk (BIASLAB_CACHE=off, or the first run on a machine): every
  process fits the 16 models (one per data split) itself;
- fits on disk: the models' probabilities on the test rows that an earlier process left in
  the fits directory beside the shared cache (biaslab.datasets.fit_cache); no model is fitted.

Each fresh figure includes every first-time cost of the run (data split, the ML predictor's
fit per split or its probabilities read from disk, prompt views, graph compilation, and the
imports the run itself makes, scikit-learn's model classes included), but not interpreter
start-up and the imports done before the run starts. The breakdown splits it into the fits (thread CPU of each fit) and the
rest. The grid is bench/scale.py's E2 grid: 16 seeds (16 splits), 240 cells, 1,180 call records.
CPU times are process_time; the 2 cores may be shared, so the load average is printed too.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe  # noqa: E402
from results_file import write_section  # noqa: E402
from scale import measure  # noqa: E402


def _fresh(fits: str = "") -> list[dict]:
    runs = [measure("cpu-fresh", "e2", 0, *([fits] if fits else [])) for _ in range(5)]
    return sorted(runs, key=lambda r: r["cpu_ms_per_call"])


def _line(label: str, runs: list[dict]) -> str:
    mid = runs[2]
    per_call = [r["cpu_ms_per_call"] for r in runs]
    rest = mid["cpu_s"] - mid["fit_cpu_s"]
    return (f"- E2, fresh process, {label}: {mid['cpu_ms_per_call']:.2f} ms CPU per call record "
            f"(median of 5 processes, range {per_call[0]:.2f}-{per_call[-1]:.2f}); "
            f"of the median's {mid['cpu_s']:.2f} s: {mid['fits']} fits {mid['fit_cpu_s']:.2f} s, "
            f"rest {rest:.2f} s (wall {mid['wall_s']:.2f} s)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    load0 = os.getloadavg()[0]
    cold = _fresh()
    with tempfile.TemporaryDirectory(prefix="biaslab-fits-") as fits:
        filled = measure("cpu-fresh", "e2", 0, fits)  # a cold process that leaves its fits
        on_disk = _fresh(fits)
    warm = measure("cpu", "e2", 0, 0)
    load1 = os.getloadavg()[0]
    lines = [
        _line("cold (no fits on disk)", cold),
        _line("fits on disk from an earlier process", on_disk) + "; target <= 1 ms",
        f"- the process that left them: {filled['cpu_ms_per_call']:.2f} ms ({filled['fits']} "
        f"fits {filled['fit_cpu_s']:.2f} s, writing included)",
        f"- E2, warm (median of 5 runs after a warm-up run): {warm['cpu_ms_per_call']:.2f} ms",
        f"- fresh / warm: cold {cold[2]['cpu_ms_per_call'] / warm['cpu_ms_per_call']:.1f}x, "
        f"fits on disk {on_disk[2]['cpu_ms_per_call'] / warm['cpu_ms_per_call']:.1f}x "
        f"({warm['calls']} call records, {warm['cells']} cells, 16 data splits)",
        f"- load average (1 min) at start / end: {load0:.2f} / {load1:.2f}",
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
