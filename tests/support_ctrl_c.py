"""Ctrl-C at random moments of a ``biaslab`` command's first seconds (imported as
``support_ctrl_c``; the test is tests/test_ctrl_c_start.py, the 50-run loop
bench/ctrl_c_loop.py).

Each try starts the console command as pip installs it (a script that imports the
``[project.scripts]`` entry of pyproject.toml and calls it), sends one SIGINT at a random
moment, and records the exit code and stderr: exit 130 with exactly one line about the
interrupt and no traceback is right; anything else (a traceback, death by the signal, a
crash) is a failure. Counted apart, not as passes: a command that ends before its moment, and
a signal that lands in the interpreter's own start-up, before biaslab's first line runs
(`Try.before_biaslab`; nothing in a package can act there).
"""

from __future__ import annotations

import os
import random
import re
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
_BIASLAB_FRAME = re.compile(r'File "[^"]*/biaslab/')
"""A traceback frame in the biaslab package (not pip's ``__editable___biaslab_*`` finder)."""


def console_script() -> str:
    """The wrapper pip writes for the ``biaslab`` console script, from pyproject.toml."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["biaslab"]
    module, _, function = entry.partition(":")
    return (f"import sys\nfrom {module} import {function}\n"
            f"if __name__ == '__main__':\n    sys.exit({function}())\n")


@dataclass
class Try:
    verb: str
    at_s: float
    code: int
    stderr: str
    finished_first: bool = False

    @property
    def before_biaslab(self) -> bool:
        """The signal landed in the interpreter's own start, before the console script's first
        import ran any line of biaslab (`biaslab.console`): in Python's initialisation or its
        ``site`` module (which loads the ``.pth`` files, an editable install's finder among
        them). Python ends by the signal there, or with exit 1 and a traceback through its own
        start-up code, with no frame in the biaslab package and no line of biaslab's."""
        return (self.code in (-signal.SIGINT, 1) and not _BIASLAB_FRAME.search(self.stderr)
                and "biaslab:" not in self.stderr)

    @property
    def problem(self) -> str | None:
        """What is wrong with this try's end, or None."""
        if self.finished_first or self.before_biaslab:
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
    """A spec and a finished run under `root`; each verb's arguments."""
    spec = root / "spec.toml"
    spec.write_text(SPEC)
    run = root / "finished"
    env = {**os.environ, "BIASLAB_CACHE": "off", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", console_script(), "run", str(spec), "--out", str(run),
                    "--quiet"], env=env, check=True, capture_output=True, cwd=root)
    return {"run": ["run", str(spec), "--out", "{out}", "--quiet"],
            "report": ["report", str(run)],
            "export": ["export", str(run), "--out", "{out}"]}


def _default_sigint() -> None:
    """Ctrl-C as a terminal gives it (a job started with ``&`` in a script ignores SIGINT, and
    its children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_once(verb: str, argv: list[str], at_s: float, root: Path, n: int) -> Try:
    """Start the command, send SIGINT `at_s` seconds later, and wait for its end."""
    out = root / f"{verb}-{n}"
    env = {**os.environ, "BIASLAB_CACHE": "off", "PYTHONPATH": str(ROOT),
           "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-c", console_script(),
                             *[a.replace("{out}", str(out)) for a in argv]],
                            env=env, cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    time.sleep(at_s)
    finished = proc.poll() is not None
    if not finished:
        proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return Try(verb, at_s, -9, err + "\n(still running 60 s after the signal)")
    return Try(verb, at_s, proc.returncode, err, finished_first=finished)


def loop(root: Path, runs: int, *, window_s: float = 3.0, seed: int = 0,
         verbs=("run", "report", "export")) -> list[Try]:
    """`runs` tries per verb at uniform random moments of its first `window_s` seconds."""
    argvs = prepare(root)
    draw = random.Random(seed)
    tries = []
    for n in range(runs):
        for verb in verbs:
            tries.append(interrupt_once(verb, argvs[verb], draw.uniform(0, window_s), root, n))
    return tries
