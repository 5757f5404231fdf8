"""Ctrl-C at random moments of a ``biaslab`` command's first seconds (imported as
``support_ctrl_c``; the test is tests/test_ctrl_c_start.py, the 50-run loop
bench/ctrl_c_loop.py).

Each try starts the ``biaslab`` command as pip installs it (`install`: the launcher
scripts/biaslab beside the ``_biaslab`` entry-point script of pyproject.toml), sends one SIGINT
at a random moment, and records the exit code and stderr: exit 130 with exactly one line
about the interrupt and no traceback is right; anything else (a traceback, death by the
signal, a crash) is a failure. Counted apart: a command that ends before its moment, and
(`Try.in_launcher_start`) a death by the signal, without a word, in the first moments, where
the signal may have landed in the launcher's own start (the shell before its trap, env before
it blocks SIGINT: nothing can act there; the bench counts these as problems, the test does not).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = """
name = "ctrlc"
protocol = "amplification"
models = ["scripted:amplification-synthetic"]
[run]
seeds = [42, 43]
concurrency = 4
[options]
pipelines = ["E0", "E2"]
max_test = 30
n_resamples = 400
[conditions]
directions = ["pro_female", "pro_male"]
targets = "singletons"
"""
INTERRUPT_LINE = re.compile(r"interrupted|Ctrl-C|quitting")
LAUNCHER_START_S = 0.1
"""A try this early that dies by the signal without a word may have landed in the launcher's own
start (well under a millisecond idle, a few under heavy load)."""


ENDED_AS_SIGNALLED_S = 0.5
"""A command that exits 0 without a word this soon after the signal was already ending."""


def install(bin_dir: Path) -> Path:
    """The ``biaslab`` command as pip installs it into `bin_dir`, from pyproject.toml: its
    ``script-files`` copied as they are, and each ``[project.scripts]`` entry as the script pip
    writes (this interpreter in its ``#!`` line). Returns the path of ``biaslab``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in project["tool"]["setuptools"]["script-files"]:
        target = bin_dir / Path(name).name
        shutil.copyfile(ROOT / name, target)
        target.chmod(0o755)
    for name, entry in project["project"]["scripts"].items():
        module, _, function = entry.partition(":")
        target = bin_dir / name
        target.write_text(f"#!{sys.executable}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                          f"from {module} import {function}\nif __name__ == '__main__':\n"
                          "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                          f"    sys.exit({function}())\n")
        target.chmod(0o755)
    return bin_dir / "biaslab"


@dataclass
class Try:
    verb: str
    at_s: float
    code: int
    stderr: str
    finished_first: bool = False
    after_signal_s: float = 0.0
    """From the signal to the command's end."""

    @property
    def in_launcher_start(self) -> bool:
        """Died by the signal without a word, early enough to have landed in the launcher's own
        start (scripts/biaslab: the shell before its trap, env before it blocks SIGINT)."""
        return (self.code == -signal.SIGINT and not self.stderr.strip()
                and self.at_s < LAUNCHER_START_S)

    @property
    def ended_as_signalled(self) -> bool:
        """Exit 0 without a word, at once: the signal came as the command was ending, after
        its last chance to answer one (biaslab.console blocks SIGINT just before
        ``os._exit``, and the kernel drops a signal sent while it tears a process down,
        which on a loaded machine takes tens of milliseconds). The command had finished its
        work; a Ctrl-C ignored mid-command would show as a command that goes on running."""
        return (self.code == 0 and not self.stderr.strip()
                and self.after_signal_s < ENDED_AS_SIGNALLED_S)

    @property
    def problem(self) -> str | None:
        """What is wrong with this try's end, or None."""
        if self.finished_first or self.ended_as_signalled:
            return None
        lines = [ln for ln in self.stderr.splitlines() if INTERRUPT_LINE.search(ln)]
        if self.code != 130:
            return f"exit {self.code}"
        if "Traceback" in self.stderr or "Fatal Python error" in self.stderr:
            return "a traceback"
        if "Ctrl-C: stopping" in self.stderr:
            # landed once the run had started: the run's own stop, as documented (a notice
            # at once, then what is kept and the command that continues it)
            if "continue with: biaslab run --resume" not in self.stderr:
                return "a run stopped without saying how to continue"
            return None
        if len(lines) != 1:
            return f"{len(lines)} interrupt lines"
        return None


def prepare(root: Path) -> dict[str, list[str]]:
    """The command installed under `root`, a spec and a finished run; each verb's arguments
    (the command first)."""
    biaslab = str(install(root / "bin"))
    spec = root / "spec.toml"
    spec.write_text(SPEC)
    run = root / "finished"
    # (its report is the verb's to write: the tries read the store only)
    subprocess.run([biaslab, "run", str(spec), "--out", str(run), "--quiet", "--no-report"],
                   env=_env(), check=True, capture_output=True, cwd=root)
    return {"run": [biaslab, "run", str(spec), "--out", "{out}", "--quiet"],
            "report": [biaslab, "report", str(run)],
            "export": [biaslab, "export", str(run), "--out", "{out}"]}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "BIASLAB_CACHE": "off", "PYTHONPATH": str(ROOT), **extra}


def _default_sigint() -> None:
    """Ctrl-C as a terminal gives it (a job started with ``&`` in a script ignores SIGINT, and
    its children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_once(verb: str, argv: list[str], at_s: float, root: Path, n: int) -> Try:
    """Start the command, send SIGINT `at_s` seconds later, and wait for its end."""
    out = root / f"{verb}-{n}"
    proc = subprocess.Popen([a.replace("{out}", str(out)) for a in argv],
                            env=_env(PYTHONFAULTHANDLER="1"), cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    time.sleep(at_s)
    finished = proc.poll() is not None
    if not finished:
        proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return Try(verb, at_s, -9, err + "\n(still running 60 s after the signal)")
    return Try(verb, at_s, proc.returncode, err, finished_first=finished,
               after_signal_s=time.monotonic() - signalled)


def loop(root: Path, runs: int, *, window_s: float = 3.0, seed: int = 0,
         verbs=("run", "report", "export"), from_s: float = 0.0) -> list[Try]:
    """`runs` tries per verb at uniform random moments of its first `window_s` seconds (from
    `from_s` on)."""
    argvs = prepare(root)
    draw = random.Random(seed)
    tries = []
    for n in range(runs):
        for verb in verbs:
            tries.append(interrupt_once(verb, argvs[verb], draw.uniform(from_s, window_s),
                                        root, n))
    return tries
