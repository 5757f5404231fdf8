"""Ctrl-C in every phase of every verb, with a real SIGINT to a `biaslab` process.

The first Ctrl-C stops the command within a few seconds, the second at once, and what is done
is kept. The calls phase is covered in tests/experiments/test_runner.py and
tests/agents/test_interrupt_local.py; here: planning, the report (of `run`, `run --resume`
and `report`), `export` and `view`. A phase is made to take a while by a wrapper that repeats
the real work forever ("busy": the real code sees the KeyboardInterrupt), or that swallows
every KeyboardInterrupt ("deaf": a main thread Python cannot interrupt, as in one long C call
or a join at exit), so that the signal always lands inside it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from biaslab.cli import main

SPEC = """
name = "ctrlc"
protocol = "amplification"
models = ["scripted:amplification-synthetic"]
[run]
seeds = [42]
concurrency = 8
[options]
pipelines = ["E2"]
max_test = 20
n_resamples = 100
[conditions]
directions = ["pro_female"]
targets = "singletons"
"""

STALLING = textwrap.dedent("""
    import os, sys, time
    how, where = os.environ["STALL_HOW"], os.environ["STALL_IN"]

    def stall(real):
        def stalled(*args, **kwargs):
            print("STALLING", file=sys.stderr, flush=True)
            while True:
                try:
                    if how == "busy":
                        real(*args, **kwargs)  # the real work, again and again
                    else:
                        time.sleep(0.02)
                except KeyboardInterrupt:
                    if how == "busy":
                        raise
        return stalled

    if where == "plan":
        import biaslab.experiments.plan as target
        target.make_plan = stall(target.make_plan)
    elif where == "report":
        import biaslab.experiments.reports as target
        target.write_reports = stall(target.write_reports)
    elif where == "export":
        from biaslab.traces.store import RunStore as target
        target.export = stall(target.export)
    from biaslab.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run (reported), made once: (spec path, run directory)."""
    root = tmp_path_factory.mktemp("ctrlc")
    spec = root / "spec.toml"
    spec.write_text(SPEC)
    run = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", "off")
        assert main(["run", str(spec), "--out", str(run), "--quiet", "--no-report"]) == 0
    return spec, run


def _start(argv, how, where, tmp_path):
    env = {**os.environ, "BIASLAB_CACHE": "off", "STALL_HOW": how, "STALL_IN": where}
    proc = subprocess.Popen([sys.executable, "-c", STALLING, *map(str, argv)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    marker = "biaslab view: " if where == "view" else "STALLING"
    while not any(marker in line for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never reached {where}: {''.join(lines)[-2000:]}")
        time.sleep(0.05)
        if where == "view":  # the URL goes to stdout
            break
    return proc, lines, reader


def _interrupt(proc, presses: int) -> float:
    """Send `presses` SIGINTs (0.3 s apart); seconds from the last one to the exit."""
    for i in range(presses):
        if i:
            time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    proc.wait(timeout=30)
    return time.monotonic() - start


def _cells_done(run) -> int:
    with sqlite3.connect(f"file:{run / 'run.sqlite'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM cells WHERE status = 'done'").fetchone()[0]


@pytest.mark.parametrize("verb, how", [("run --resume", "busy"), ("report", "deaf")])
def test_the_report_phase_stops_on_the_first_ctrl_c(finished, tmp_path, verb, how):
    spec, run = finished
    cells = _cells_done(run)
    argv = ["run", "--resume", run, "--quiet"] if verb == "run --resume" else ["report", run]
    proc, lines, reader = _start(argv, how, "report", tmp_path)
    took = _interrupt(proc, 1)
    reader.join(5)
    err = "".join(lines)
    assert proc.returncode == 130, err
    # busy: the KeyboardInterrupt ends it at once; deaf: the watcher ends it after 3 s
    assert took < (4.0 if how == "busy" else 7.0), (took, err)
    assert "Traceback" not in err
    assert f"write its report with: biaslab report {run}" in err, err
    assert _cells_done(run) == cells  # what was done is kept


@pytest.mark.parametrize("where", ["report", "plan"])
def test_a_second_ctrl_c_quits_at_once(finished, tmp_path, where):
    spec, run = finished
    argv = {"report": ["report", run], "plan": ["run", spec, "--out", tmp_path / "new"],
            "export": ["export", run, "--out", tmp_path / "export"]}[where]
    proc, lines, reader = _start(argv, "deaf", where, tmp_path)
    took = _interrupt(proc, 2)
    reader.join(5)
    err = "".join(lines)
    assert proc.returncode == 130 and took < 2.0, (took, err)
    assert "Ctrl-C again: quitting now" in err and "Traceback" not in err
    if where == "plan":
        assert not (tmp_path / "new").exists()  # planning wrote nothing


@pytest.mark.parametrize("where", ["plan", "export"])
def test_planning_and_export_stop_on_the_first_ctrl_c(finished, tmp_path, where):
    spec, run = finished
    argv = {"plan": ["run", spec, "--out", tmp_path / "new"],
            "export": ["export", run, "--out", tmp_path / "export"]}[where]
    proc, lines, reader = _start(argv, "busy", where, tmp_path)
    took = _interrupt(proc, 1)
    reader.join(5)
    err = "".join(lines)
    assert proc.returncode == 130 and took < 4.0, (took, err)
    assert "biaslab: interrupted" in err and "Traceback" not in err


def test_view_stops_on_the_first_ctrl_c(finished, tmp_path):
    spec, run = finished
    proc = subprocess.Popen([sys.executable, "-m", "biaslab", "view", str(run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "BIASLAB_CACHE": "off"})
    assert "biaslab view: http://127.0.0.1:" in proc.stdout.readline()
    took = _interrupt(proc, 1)
    assert proc.returncode in (0, 130) and took < 4.0, took
    assert "Traceback" not in proc.stderr.read()


def test_view_shows_a_store_with_a_damaged_row_marked(finished, tmp_path):
    """`biaslab view` on a store with one damaged row serves it (docs/viewer.md: such rows are
    listed marked damaged), instead of refusing the whole run."""
    import json
    import shutil
    import urllib.request

    _, source = finished
    run = tmp_path / "run"
    shutil.copytree(source, run)
    with sqlite3.connect(run / "run.sqlite") as conn:
        bad = conn.execute("SELECT cell_id FROM cells ORDER BY ord LIMIT 1").fetchone()[0]
        conn.execute("UPDATE cells SET coords = '{\"target\": ' WHERE cell_id = ?", (bad,))
    proc = subprocess.Popen([sys.executable, "-m", "biaslab", "view", str(run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "BIASLAB_CACHE": "off", "NO_PROXY": "*"})
    try:
        line = proc.stdout.readline()
        assert "biaslab view: http://127.0.0.1:" in line, proc.stderr.read() if \
            proc.poll() is not None else line
        base = line.split()[2].rstrip("/")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{base}/api/cells", timeout=30) as response:
            cells = json.loads(response.read())
        damaged = [c["cell_id"] for c in cells["rows"] if c.get("damaged")]
        assert damaged == [bad], cells
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
