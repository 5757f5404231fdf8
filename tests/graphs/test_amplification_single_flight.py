"""One model fit per data split in a fresh process, however many cells of that split run at
once: the ML node's per-split work is single-flight, not one fit per worker thread that missed
the cache at the same moment."""

from __future__ import annotations

import subprocess
import sys

from support_runs import COUNT_FITS

SPEC = """
name = "fits"
protocol = "amplification"
models = ["scripted:amplification-synthetic"]
[run]
seeds = [42, 43]
concurrency = 16
[options]
pipelines = ["E2"]
max_test = 20
n_resamples = 100
[conditions]
directions = ["pro_female", "pro_male"]
targets = "singletons"
"""



def test_one_fit_per_split_in_a_fresh_process(tmp_path):
    spec = tmp_path / "fits.toml"
    spec.write_text(SPEC)
    proc = subprocess.run([sys.executable, "-c", COUNT_FITS, str(spec), str(tmp_path / "run"),
                           "--no-figures"],
                          capture_output=True, text=True, timeout=600,
                          env={"BIASLAB_CACHE": "off", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("FITS"))
    # 2 seeds = 2 splits; 14 cells (clean + 3 agents x 2 directions, per seed) share them
    assert line == "FITS [42, 43]", line
