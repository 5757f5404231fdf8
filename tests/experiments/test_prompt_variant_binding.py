"""``prompt = "@terse"`` in a spec binds each variant's own terse prompt, as ``replay --prompt
@terse`` does: E0's prediction gets ``predict@terse`` and E1's ``predict_with_explanation@terse``."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

SPEC = """
name = "terse"
protocol = "amplification"
models = ["scripted:amplification-synthetic"]
[run]
seeds = [42]
[options]
pipelines = ["E0", "E1"]
max_test = 10
n_resamples = 100
[conditions]
targets = []
[nodes.prediction]
prompt = "{binding}"
"""


def _biaslab(*args, cwd):
    return subprocess.run([sys.executable, "-m", "biaslab.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={"BIASLAB_CACHE": "off", "PATH": "/usr/bin:/bin"})


def test_at_variant_binding_in_a_spec(tmp_path: Path):
    (tmp_path / "terse.toml").write_text(SPEC.format(binding="@terse"))
    proc = _biaslab("run", "terse.toml", "--out", "run", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    store = sqlite3.connect(tmp_path / "run" / "run.sqlite")
    used = {(json.loads(coords)["variant"], json.loads(rec)["prompt_id"])
            for rec, coords in store.execute(
                "SELECT calls.record, cells.coords FROM calls JOIN cells USING (cell_id) "
                "WHERE calls.node = 'prediction'")}
    assert used == {("E0", "amplification/predict@terse"),
                    ("E1", "amplification/predict_with_explanation@terse")}


def test_unknown_at_variant_is_one_line(tmp_path: Path):
    (tmp_path / "terse.toml").write_text(SPEC.format(binding="@nonexistent"))
    proc = _biaslab("run", "terse.toml", "--out", "run", cwd=tmp_path)
    assert proc.returncode == 2
    assert "predict@nonexistent" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
