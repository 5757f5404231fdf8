"""The run's progress display: cell count, ETA and call counters readable at 80 columns."""

from __future__ import annotations

import re
import time
from io import StringIO
from pathlib import Path

from rich.console import Console

from biaslab.agents.gateway import RunCounters
from biaslab.experiments.runner import _Progress

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _render(progress: _Progress, width: int = 80) -> list[str]:
    """What the bar draws now, as plain lines."""
    out = StringIO()
    Console(width=width, file=out, force_terminal=True).print(progress.bar.get_renderable())
    return [line.rstrip() for line in _ANSI.sub("", out.getvalue()).splitlines() if line.strip()]


def _progress(total: int, counters: RunCounters) -> tuple[_Progress, StringIO]:
    sink = StringIO()
    console = Console(width=80, file=sink, force_terminal=True)
    return _Progress(total, counters, enabled=True, console=console), sink


def test_count_and_eta_visible_at_80_columns():
    counters = RunCounters(calls=1)  # a call was made: the cells below were run, not skipped
    progress, sink = _progress(1234, counters)
    try:
        progress.started -= 100.0  # 100 s into the run
        progress.advance(617)  # half done -> ~100 s left
        counters.model_calls, counters.cache_hits, counters.tokens = 5321, 402, 1_234_567
        counters.parse_failures, counters.errors, counters.retries = 7, 2, 3
        lines = _render(progress)
    finally:
        progress.stop()
    assert all(len(line) <= 80 for line in lines), lines
    cells = next(line for line in lines if line.startswith("cells"))
    assert "617/1234" in cells
    eta = re.search(r"eta (\d+):(\d\d):(\d\d)", cells)
    assert eta, cells
    left = int(eta[1]) * 3600 + int(eta[2]) * 60 + int(eta[3])
    assert 95 <= left <= 105
    assert re.search(r"0:01:4\d elapsed", cells)
    calls = next(line for line in lines if line.startswith("calls"))
    for part in ("calls 5,321", "cached 402", "retry 3", "err 2", "unparsed 7", "tok 1.2M"):
        assert part in calls, calls
    # the live display written to the console shows the same (nothing truncated with "…")
    drawn = _ANSI.sub("", sink.getvalue())
    assert "617/1234" in drawn and "eta 0:01:" in drawn and "…" not in drawn


def test_a_retry_says_why():
    counters = RunCounters(calls=1)
    progress, _ = _progress(3, counters)
    try:
        assert "retry 0 ·" in progress.status()
        counters.retries, counters.last_retry = 3, "timeout after 300 s"
        assert "retry 3 (timeout after 300 s) ·" in progress.status()
    finally:
        progress.stop()


def test_calls_move_during_a_long_cell():
    counters = RunCounters()
    progress, _ = _progress(3, counters)
    try:
        before = _render(progress)
        counters.calls = counters.model_calls = 12  # calls inside a cell, no cell finished
        after = _render(progress)
    finally:
        progress.stop()
    assert any(line.startswith("cells") and "0/3" in line for line in after)
    assert any("calls 0 " in line for line in before)
    assert any("calls 12 " in line for line in after)


def test_cells_skipped_on_resume_do_not_set_the_pace():
    counters = RunCounters()
    progress, _ = _progress(10, counters)
    try:
        progress.advance(8)  # done before any call: skipped by --resume
        assert progress.eta_s() is None
        counters.calls = 4
        progress.started -= 50.0
        progress.advance(1)  # one cell run in 50 s, one left
        assert 45 <= progress.eta_s() <= 55
    finally:
        progress.stop()


def test_off_a_terminal_a_status_line_comes_without_cell_progress(monkeypatch, capsys):
    monkeypatch.setattr(_Progress, "_LOG_EVERY_S", 0.05)
    counters = RunCounters(calls=3, model_calls=3)
    progress = _Progress(5, counters, enabled=True,
                         console=Console(file=StringIO(), force_terminal=False))
    try:
        assert progress.bar is None
        seen, deadline = "", time.monotonic() + 5
        while "calls 3 " not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capsys.readouterr().err
    finally:
        progress.stop()
    assert "cells 0/5" in seen and "calls 3 " in seen, seen
    # and quiet means quiet
    quiet = _Progress(5, counters, enabled=False)
    quiet.advance()
    quiet.stop()
    assert quiet.bar is None and quiet._thread is None


def test_eta_follows_the_calls_while_no_cell_has_finished():
    """Packed cells finish together: with 400 calls expected and 100 completed in 30 s, the ETA
    is 90 s although no cell is done yet; cells skipped on resume take their calls off. Calls
    that have only started, and cache hits, set no pace."""
    counters = RunCounters()
    sink = StringIO()
    progress = _Progress(8, counters, enabled=True, expected_calls=400.0,
                         console=Console(width=80, file=sink, force_terminal=True))
    try:
        assert progress.eta_s() is None  # nothing made yet: no pace
        progress.started -= 30.0
        counters.calls = 150  # started, none answered yet
        assert progress.eta_s() is None
        counters.cache_hits = 40  # answered at once: no pace either
        assert progress.eta_s() is None
        counters.cache_hits, counters.model_calls = 0, 100
        assert 89 <= progress.eta_s() <= 91
        counters.cache_hits = 100  # 200 answered, 100 of them paid in 30 s: 200 left, 60 s
        assert 59 <= progress.eta_s() <= 61
        counters.cache_hits = 0
        progress.advance(2, skipped_calls=100.0)  # two cells of 50 calls each already done
        assert 59 <= progress.eta_s() <= 61  # 200 left at 100 per 30 s
        counters.model_calls = 350  # more than now expected (300): back to the cells' pace
        progress.advance(2)
        assert 29 <= progress.eta_s() <= 31  # 4 of 8 done in 30 s, 4 left
    finally:
        progress.stop()


def test_the_closing_summary_fits_80_columns():
    from pathlib import Path

    from biaslab.experiments.runner import RunResult

    result = RunResult(Path("runs/x"), 1234)
    result.cells_run, result.cells_skipped, result.cells_failed = 1200, 30, 4
    result.elapsed_s = 1234.5
    c = result.counters
    c.model_calls, c.cache_hits, c.retries, c.errors, c.parse_failures, c.tokens = (
        12345, 6789, 12, 4, 56, 9_876_543)
    lines = result.summary().splitlines()
    assert lines == ["done: 1200 cells run, 30 already done, 4 failed of 1234 in 1234.5s, "
                     "9.9M tokens",
                     "  12345 model calls, 6789 cache hits, 12 retries, 4 errors, 56 unparsed"]
    assert all(len(line) <= 80 for line in lines)


def test_a_partly_cached_run_with_latency_gets_an_honest_eta(tmp_path, monkeypatch):
    """Through the CLI: 8 hiring candidates answered once (so cached), then 24, one call at a
    time, each paid call taking 0.12 s. The 8 cache hits come back at once; counting them (or
    calls merely started) as progress would promise the other 16 at the cache's speed. Every
    ETA printed after the first paid call must be within a factor of 2 of the time actually
    left."""
    import shutil

    from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
    from biaslab.cli import main

    register_scripted("slow-panel", lambda: ScriptedChatModel(
        name_="slow-panel", latency_s=0.12, rules=[Rule(r"Candidate", '{"decision": "hire"}')]))
    examples = Path(__file__).resolve().parents[2] / "experiments" / "examples"
    shutil.copytree(examples / "prompts", tmp_path / "prompts")
    shutil.copy(examples / "hiring.py", tmp_path)
    spec = (examples / "hiring.toml").read_text().replace(
        'models = ["scripted:hiring-panel", "scripted:hiring-panel@women=6"]',
        'models = ["scripted:slow-panel"]').replace("seeds = [42, 43, 44]",
                                                    "seeds = [42]\nconcurrency = 1")
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(spec.replace("candidates = 24", "candidates = 8"))
    second.write_text(spec)
    assert main(["run", str(first), "--out", str(tmp_path / "a"), "--quiet"]) == 0

    samples = []
    times = _Progress.times

    def recording(self):
        samples.append((time.monotonic(), self.eta_s(), self.counters.model_calls))
        return times(self)

    stopped = []
    stop = _Progress.stop

    def stopping(self):
        stopped.append(time.monotonic())  # the cells are done; the report is not the ETA's
        return stop(self)

    monkeypatch.setattr(_Progress, "times", recording)
    monkeypatch.setattr(_Progress, "stop", stopping)
    monkeypatch.setattr(_Progress, "_LOG_EVERY_S", 0.2)
    assert main(["run", str(second), "--out", str(tmp_path / "b")]) == 0
    end = stopped[0]
    paced = [(t, eta) for t, eta, paid in samples if paid >= 2 and eta and t < end - 0.3]
    assert len(paced) >= 4, samples
    for t, eta in paced:
        left = end - t
        assert left / 2 <= eta <= 2 * left + 0.3, (eta, left, samples)
