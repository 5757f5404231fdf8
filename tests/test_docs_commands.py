"""Every docs page runs as printed: each page's ``bash`` blocks, in order, on a fresh copy of
``experiments/`` of its own (so the pages run in any order and share nothing), with no API key,
an empty response cache and a temporary home, as ``tests/test_readme.py`` runs the README.

What a line's own comment says is how it is checked, so the exceptions are visible on the page:

- ``# needs X_API_KEY`` (hosted only): must stop before any call with one line naming
  ``X_API_KEY`` and exit 2.
- ``# needs a running ... server`` or ``# starts a ... server`` (vLLM, Ollama, llama-server):
  not run; no such server exists here, and starting one is the reader's step, not biaslab's.
- ``# embedded model ...``: not run; these run the embedded SmolLM2 model, minutes a line on
  two cores, and they are what ``make demo`` and the ``local_model`` tests run.
- ``biaslab view ...``: started, checked to serve the run on the printed port (8765 unless
  ``--port``) within 30 s, then stopped; skipped only when another process holds that port.
- ``make ...`` lines (how this suite got here) and comment-only lines are not run.

Every other line must exit 0. ``docs/python.md``'s Python block runs the same way.

A line that is one plain ``biaslab`` command (no shell syntax: no ``;``, pipe, redirect,
variable or assignment) runs in this process, through `biaslab.cli.main` with the line's own
arguments, in the page's folder and environment: what the console script would run, without
importing biaslab's libraries again for every line (two to three seconds a line, most of this
file's time; issue 48). Every other line, and every ``biaslab view``, runs through ``bash`` as
printed. The README tour (``tests/test_readme.py``) runs each of its lines through the shell
and the console script, so that boundary stays tested on the newcomer's path.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from biaslab.cli import main
from support_commands import HOSTED, VENV, clean_env, commands

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXTERNAL = re.compile(r"#.*\b(needs a running|starts a)\b.*\bserver\b")
EMBEDDED = re.compile(r"#\s*embedded model\b")
SHELL_SYNTAX = re.compile(r"[;&|<>$`(){}\[\]\\*?=~!]")
PAGES = sorted(p for p in DOCS.rglob("*.md") if commands(p.read_text()))


def _copy(tmp: Path) -> None:
    shutil.copytree(ROOT / "experiments", tmp / "experiments")
    (tmp / ".venv").symlink_to(VENV, target_is_directory=True)


def _port(line: str) -> int:
    found = re.search(r"--port[ =](\d+)", line)
    return int(found.group(1)) if found else 8765


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _check_view(line: str, tmp: Path, env: dict[str, str]) -> str:
    """Start a ``biaslab view`` line as printed; it must serve its run, then it is stopped."""
    port = _port(line)
    if _port_taken(port):
        return f"skipped (port {port} in use): {line}"
    run_dir = line.split()[2]
    proc = subprocess.Popen(["bash", "-c", f". .venv/bin/activate && exec {line}"], cwd=tmp,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/meta", timeout=2) as r:
                    assert r.status == 200 and Path(run_dir).name.encode() in r.read(), line
                return f"served: {line}"
            except OSError:
                assert proc.poll() is None, f"{line!r} exited: {proc.stderr.read()[-2000:]}"
                assert time.monotonic() < deadline, f"{line!r} did not serve within 30 s"
                time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _plain_biaslab(line: str) -> list[str] | None:
    """The arguments of a line that is one ``biaslab`` command and nothing else (its trailing
    comment aside), or None for a line that needs the shell."""
    words = shlex.split(line, comments=True)
    command = line.split(" #", 1)[0]
    if not words or words[0] != "biaslab" or SHELL_SYNTAX.search(command):
        return None
    return words[1:]


def _in_process(argv: list[str], tmp: Path, env: dict[str, str], capsys) -> tuple[int, str, str]:
    """`biaslab.cli.main(argv)` in `tmp` with exactly the environment `env` (as the console
    script would run it there); its exit code, stdout and stderr. The environment is put back
    whole afterwards, so nothing the command sets (an app's env file, say) outlives it, as
    nothing would outlive its process."""
    saved = os.environ.copy()
    os.environ.clear()
    os.environ.update(env)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp)
            capsys.readouterr()
            code = main(argv)
            out, err = capsys.readouterr()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, out, err


def _run_page(page: Path, tmp: Path, capsys) -> list[str]:
    """Run one page's command lines in order; returns what was done with each line."""
    _copy(tmp)
    env = clean_env(tmp)
    done: list[str] = []
    for line in commands(page.read_text()):
        if line.startswith("#") or line.startswith("make "):
            continue
        if EXTERNAL.search(line) or EMBEDDED.search(line):
            done.append(f"skipped (marked): {line}")
            continue
        if line.startswith("biaslab view "):
            done.append(_check_view(line, tmp, env))
            continue
        argv = _plain_biaslab(line)
        if argv is not None:
            code, out, err = _in_process(argv, tmp, env, capsys)
        else:
            # -e: in ``a ; b`` a failing ``a`` fails the line too
            proc = subprocess.run(["bash", "-e", "-c", f". .venv/bin/activate && {line}"],
                                  cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        assert "Traceback" not in err, f"{page.name}: {line}\n{err[-2000:]}"
        hosted = HOSTED.search(line)
        if hosted:
            lines = err.strip().splitlines()
            assert code == 2, f"{page.name}: {line!r}: exit {code}, not 2"
            assert len(lines) == 1 and hosted.group(1) in lines[0], (page.name, line, err)
            done.append(f"refused without {hosted.group(1)}: {line}")
        else:
            assert code == 0, (f"{page.name}: command failed: {line}\n"
                               f"{out[-2000:]}\n{err[-2000:]}")
            done.append(f"ran: {line}" if argv is None else f"ran (in process): {line}")
    return done


def test_plain_biaslab_lines_are_told_from_shell_lines():
    assert _plain_biaslab("biaslab run a.toml --out runs/x  # offline, seconds") == [
        "run", "a.toml", "--out", "runs/x"]
    assert _plain_biaslab("biaslab replay runs/math --mode strict  # re-execute; every call") \
        == ["replay", "runs/math", "--mode", "strict"]
    for line in ("biaslab prompts list ; biaslab prompts show amplification/judge",
                 "biaslab run $SPEC", "X_BASE_URL=http://h biaslab run s.toml",
                 "biaslab export runs/math > out.txt", "biaslab report runs/a | head",
                 "biaslab run ~/spec.toml", "biaslab view runs/x --port=9000",
                 "vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000"):
        assert _plain_biaslab(line) is None, line


def test_the_pages_with_commands_are_found():
    names = {str(p.relative_to(DOCS)) for p in PAGES}
    assert {"running.md", "replay.md", "compose.md", "viewer.md", "models.md", "traces.md",
            "audit.md"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_docs_command_runs_as_printed(page, tmp_path, capsys):
    done = _run_page(page, tmp_path, capsys)
    print("\n".join(done))
    assert done, f"{page.name}: no line was checked"
    if page.name != "models.md":  # its every line needs a local server the reader starts
        assert any(d.startswith(("ran: biaslab", "ran (in process): biaslab", "served: "))
                   for d in done), done


def test_the_python_page_runs_as_printed(tmp_path):
    """``docs/python.md``'s Python block, on a fresh copy, offline, writes what it names."""
    _copy(tmp_path)
    blocks = re.findall(r"^```python\n(.*?)^```", (DOCS / "python.md").read_text(),
                        flags=re.S | re.M)
    assert blocks
    proc = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path,
                          env=clean_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{blocks[0]}\n{proc.stderr[-2000:]}"
    assert (tmp_path / "runs/review-smoke/report.html").is_file()
    assert (tmp_path / "runs/review-reminder-py/report.html").is_file()
