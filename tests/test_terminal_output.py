"""What a user sees on an 80-column terminal: the headline table is never cut ("…"), and the
commands that were wrong before say what to do."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(args: list[str], cwd: Path, columns: int = 80, stderr: bool = False) -> str:
    """Run biaslab with stdout (or stderr) on a pseudo-terminal of `columns` columns; its
    plain text."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "BIASLAB_CACHE": "off",
           "TERM": "xterm"}
    streams = ({"stdout": subprocess.DEVNULL, "stderr": follower} if stderr
               else {"stdout": follower, "stderr": subprocess.DEVNULL})
    proc = subprocess.Popen([sys.executable, "-m", "biaslab.cli", *args], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, **streams)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    assert proc.returncode == 0
    return _ANSI.sub("", b"".join(chunks).decode("utf-8", "replace")).replace("\r", "")


def test_a_wide_headline_is_stacked_not_cut(tmp_path):
    run = tmp_path / "mt"
    proc = subprocess.run([sys.executable, "-m", "biaslab.cli", "run",
                           str(ROOT / "experiments/multiturn.toml"), "--scale", "smoke",
                           "--model", "scripted:multiturn-late", "--all-nodes", "--out", str(run),
                           "--quiet", "--no-report"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "BIASLAB_CACHE": "off"})
    assert proc.returncode == 0, proc.stderr
    text = _on_a_terminal(["report", str(run), "--no-figures"], cwd=tmp_path)
    headline = text[text.index("multiturn: cumulative bias"):]
    lines = [line for line in headline.splitlines() if line.strip()]
    assert "…" not in headline
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    # every value of the table is there whole: the exposed arm's interval and the full model name
    assert re.search(r"cum_bias\s+0\.50 \[0\.09, 0\.91\]", headline)
    assert re.search(r"model\s+scripted:multiturn-late", headline)
    # the fields all rows share once, then each row under its own rule, fields side by side:
    # 8 rows of 9 fields in 28 lines, not the 73 of one field per line
    rows = re.findall(r"── row (\d+) of (\d+) ─", headline)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 2
    assert "every row:" in headline
    assert len(lines) <= 4 + 3 * len(rows), headline
    # and a file or pipe still gets the table, one row per line
    piped = subprocess.run([sys.executable, "-m", "biaslab.cli", "report", str(run),
                            "--no-figures"],
                           capture_output=True, text=True, timeout=300).stdout
    assert re.search(r"│ static-anaphora_ellipsis\s+│ scripted:multiturn-late\s+│ target:stereotype",
                     piped)


def test_resume_of_a_missing_directory_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "biaslab.cli", "run", "--resume",
                           "runs/missing"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("biaslab: error: no run directory at runs/missing to resume "
                                   "(start one with: biaslab run SPEC.toml --out runs/missing)")
    assert not (tmp_path / "runs").exists()


def test_protocols_with_a_spec_lists_its_protocol_only(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "biaslab.cli", "protocols", "--spec",
                           str(ROOT / "experiments/examples/review.toml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0
    names = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert names == ["review"]


def test_workers_draw_one_progress_bar_from_their_stores(tmp_path):
    """`--workers 2` shows the bar one process would: every cell and call of both shards."""
    import tomli_w

    from biaslab.traces.store import RunStore
    from support_runs import amplification_spec

    spec = tmp_path / "grid.toml"
    spec.write_text(tomli_w.dumps(amplification_spec(options={
        "datasets": ["math"], "pipelines": ["E0", "E1"], "max_test": 20},
        run={"seeds": list(range(1, 9))})))
    run = tmp_path / "run"
    text = _on_a_terminal(["run", str(spec), "--out", str(run), "--workers", "2",
                           "--no-report"], cwd=tmp_path, stderr=True)
    store = RunStore(run, readonly=True)
    cells, calls = len(store.cells()), store.counts()
    store.close()
    assert re.search(rf"cells .*\b{cells}/{cells}\b", text), text[-2000:]
    paid = calls["calls"] - calls["cache_hits"] - calls["call_errors"]
    assert f"calls {paid:,} " in text and f"cached {calls['cache_hits']:,} " in text, text[-2000:]


SLOW = """
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
register_scripted("slow-panel", lambda: ScriptedChatModel(
    name_="slow-panel", latency_s=0.3, rules=[Rule(r"Candidate", '{"decision": "hire"}')]))
"""


def test_the_ctrl_c_message_is_whole_on_an_80_column_terminal(tmp_path):
    """Ctrl-C under the live progress bar: what an 80-column terminal shows afterwards (pyte
    replays the bytes, cursor moves included) holds the whole message, none of it overwritten
    by the bar's next redraw."""
    import fcntl
    import shutil
    import signal
    import struct
    import termios
    import time

    import pyte

    examples = ROOT / "experiments" / "examples"
    shutil.copytree(examples / "prompts", tmp_path / "prompts")
    shutil.copy(examples / "hiring.py", tmp_path)
    (tmp_path / "slow.py").write_text(SLOW)
    spec = (examples / "hiring.toml").read_text().replace(
        'plugins = ["hiring.py"]', 'plugins = ["hiring.py", "slow.py"]').replace(
        'models = ["scripted:hiring-panel", "scripted:hiring-panel@women=6"]',
        'models = ["scripted:slow-panel"]').replace("seeds = [42, 43, 44]",
                                                   "seeds = [42]\nconcurrency = 1")
    (tmp_path / "slow.toml").write_text(spec)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    env = {**os.environ, "COLUMNS": "80", "LINES": "50", "BIASLAB_CACHE": "off",
           "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "biaslab.cli", "run", "slow.toml", "--out",
                             "run"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower)
    os.close(follower)
    chunks, sent, deadline = [], None, time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = _ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))
        if sent is None and re.search(r"\b[2-9]/24\b", seen):  # the bar is up and moving
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    assert sent is not None and proc.returncode == 130
    screen = pyte.Screen(80, 50)
    pyte.ByteStream(screen).feed(b"".join(chunks))
    shown = [line.rstrip() for line in screen.display if line.strip()]
    assert ("biaslab: Ctrl-C: stopping; finished cells and returned answers are kept"
            in shown), shown
    assert "biaslab: (Ctrl-C again to quit at once)" in shown, shown
    assert any(line.startswith("interrupted: ") for line in shown), shown
