"""Ctrl-C at random moments of the first 3 s of ``run``, ``report`` and ``export``, through
the console script as pip installs it: exit 130 and one line every time, no traceback, no
crash (issue 47). A few tries per verb here (``BIASLAB_CTRL_C_RUNS``, default 8); the 50-run
loop is ``python bench/ctrl_c_loop.py --runs 50``."""

from __future__ import annotations

import os

import support_ctrl_c


def test_ctrl_c_in_the_first_seconds_is_exit_130_and_one_line(tmp_path):
    runs = int(os.environ.get("BIASLAB_CTRL_C_RUNS", "8"))
    tries = support_ctrl_c.loop(tmp_path, runs, seed=47)
    problems = [f"{t.verb} at {t.at_s:.2f} s: {t.problem}: {t.stderr[-600:]!r}"
                for t in tries if t.problem]
    assert not problems, "\n".join(problems)
    interrupted = [t for t in tries if not t.finished_first and not t.before_biaslab]
    assert len(interrupted) >= len(tries) // 2  # the signals did land in the commands
    for verb in ("run", "report", "export"):
        assert any(t.verb == verb for t in interrupted)
