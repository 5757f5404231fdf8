"""How long the ``biaslab`` launcher (scripts/biaslab) leaves Ctrl-C unanswered at its very
start: ``python bench/ctrl_c_window.py [--tries 600]``.

SIGINT is sent at uniform random moments of the first 10 ms after ``exec`` to: the launcher
in front of a stand-in for ``_biaslab`` (a shell that sleeps 50 ms, so only the launcher's own
start is measured); a one-line ``#!/usr/bin/env -S --block-signal=INT /bin/sh`` script (the
alternative without a fallback); and ``/bin/true``, whose whole life is the floor. A try that
dies by the signal landed in the unguarded start; deaths / tries x 10 ms estimates its length.
Needs GNU env with ``--block-signal``. Results in bench/results.md."""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=600)
    parser.add_argument("--window-ms", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="biaslab-ctrl-c-window-") as tmp:
        tmp = Path(tmp)
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()
        shutil.copyfile(ROOT / "scripts/biaslab", tmp / "a/biaslab")
        (tmp / "a/_biaslab").write_text("#!/bin/sh\nexec sleep 0.05\n")
        (tmp / "b/biaslab").write_text("#!/usr/bin/env -S --block-signal=INT /bin/sh\n"
                                       "exec sleep 0.05\n")
        for p in [tmp / "a/biaslab", tmp / "a/_biaslab", tmp / "b/biaslab"]:
            p.chmod(0o755)
        commands = {"launcher (scripts/biaslab)": [str(tmp / "a/biaslab")],
                    "#!/usr/bin/env -S --block-signal": [str(tmp / "b/biaslab")],
                    "/bin/true (its whole life)": ["/bin/true"]}
        ends = {name: collections.Counter() for name in commands}
        draw = random.Random(0)
        for _ in range(args.tries):
            delay = draw.uniform(0, args.window_ms / 1000)
            for name, argv in commands.items():
                proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL, preexec_fn=lambda:
                                        signal.signal(signal.SIGINT, signal.SIG_DFL))
                time.sleep(delay)
                proc.send_signal(signal.SIGINT)
                ends[name][proc.wait()] += 1
    print(f"load average {os.getloadavg()[0]:.1f}; {args.tries} tries each, SIGINT at "
          f"0-{args.window_ms:g} ms")
    for name, counts in ends.items():
        died = counts[-signal.SIGINT]
        print(f"{name:36} died by the signal {died:4} (~{died / args.tries * args.window_ms:.2f} ms)"
              f"  130 (trap) {counts[130]:4}  0 (blocked in time) {counts[0]:4}")


if __name__ == "__main__":
    main()
