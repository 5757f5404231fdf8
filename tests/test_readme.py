"""The README runs as printed: every command block, in order, on a copy of the checkout, with
no API key and an empty response cache.

Marked exceptions, each visible in the README itself: ``make ...`` lines (they are how this
suite got here) are not run again, and a line ending in ``# needs X_API_KEY`` is a hosted-only
command that must stop before any call with one line naming ``X_API_KEY`` and exit 2. The
numbers the README quotes from the tour's tables are read back from those tables.
"""

from __future__ import annotations

import csv
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from support_commands import HOSTED, VENV, clean_env, commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


pytestmark = pytest.mark.early  # the tour takes minutes: `make test` starts it first


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """Every README command, run in order in a fresh copy of ``experiments/``."""
    tmp = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "experiments", tmp / "experiments")
    (tmp / ".venv").symlink_to(VENV, target_is_directory=True)
    env = clean_env(tmp)
    lines = commands(README.read_text())
    assert lines and lines[0].startswith("make demo"), "the README starts with the two commands"
    ran = []
    activated = False
    for line in lines:
        if line.startswith("make "):
            continue
        if line.startswith(". .venv/bin/activate"):
            activated = True
            continue
        assert activated, f"README runs {line!r} before activating the environment"
        proc = subprocess.run(["bash", "-c", f". .venv/bin/activate && {line}"], cwd=tmp,
                              env=env, capture_output=True, text=True, timeout=600)
        hosted = HOSTED.search(line)
        if hosted:
            err = proc.stderr.strip().splitlines()
            assert proc.returncode == 2, f"{line!r}: exit {proc.returncode}, not 2"
            assert len(err) == 1 and hosted.group(1) in err[0], (line, proc.stderr)
            assert "Traceback" not in proc.stderr
        else:
            assert proc.returncode == 0, (f"README command failed: {line}\n"
                                          f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        ran.append(line)
    return tmp, ran, env


def test_every_readme_command_ran(tour):
    _, ran, _ = tour
    assert any(c.startswith("biaslab run ") for c in ran)
    assert any("# needs " in c for c in ran), "the hosted-only line is checked too"


def test_the_numbers_the_readme_quotes(tour):
    tmp, _, _ = tour
    rows = _read(tmp / "runs/tour/review/tables/exposed_vs_clean.csv")
    older = [r for r in rows if r["field"] == "decision=older" and r["group"] == "all"]
    assert older
    for r in older:
        expected = 1.0 if r["condition"].endswith(":pro_older") else 0.0
        assert float(r["diff"]) == expected and int(r["n_pairs"]) == 4, r
        assert int(r["n_seeds"]) == 3 and r["note"] == "too few pairs (n=4)", r
    mitigated = [r for r in _read(tmp / "runs/tour/review-reminder/tables/mitigation_effects.csv")
                 if r["field"] == "decision=older" and r["group"] == "all"]
    assert {r["exposure"] for r in mitigated} >= {"none", "draft:pro_older"}
    for r in mitigated:
        expected = -1.0 if r["exposure"].endswith(":pro_older") else 0.0
        assert float(r["diff"]) == expected and int(r["n_pairs"]) == 4, r
    for name in ("roleplay", "multiturn", "augmentation"):
        assert (tmp / f"runs/tour/{name}/report.html").is_file()
    pair = next(r for r in _read(tmp / "runs/tour/two-models/tables/model_comparisons.csv")
                if r["variant"] == "role" and r["stratum"] == "type=choice"
                and r["group"] == "all")
    assert (pair["n_pairs"], round(float(pair["mean_a"]), 3), round(float(pair["mean_b"]), 3),
            round(float(pair["diff"]), 3), pair["test"], pair["family_size"]) == (
        "33", 0.030, 0.667, 0.636, "mcnemar_exact", "4"), pair
    assert (f"{float(pair['p']):.1e}", f"{float(pair['p_holm']):.1e}") == ("9.5e-07", "3.8e-06")
    why = next(r for r in _read(tmp / "runs/tour/roleplay/tables/judge_sensitivity.csv")
               if r["table"] == "table5" and r["row"].endswith("type=why"))
    assert (round(float(why["recorded"]), 3), round(float(why["band_low"]), 3),
            round(float(why["band_high"]), 3), why["sign_flips"], why["flipped_by"]) == (
        1.0, -1.0, 1.0, "True", "only:scripted:roleplay-contrarian-judge unanimous"), why
    overall = next(r for r in _read(tmp / "runs/tour/roleplay/tables/judge_sensitivity.csv")
                   if r["table"] == "table5" and r["row"].endswith("type=overall"))
    assert (overall["significance_flips"], overall["flipped_by"]) == (
        "True", "only:scripted:roleplay-contrarian-judge"), overall
    runs = _read(tmp / "runs/tour/roleplay/tables/judge_sensitivity_runs.csv")
    assert sum(int(r["paid_model_calls"] or 0) for r in runs) == 12, runs
    probe = next(r for r in _read(tmp / "runs/tour/multiturn-probe/tables/judge_bias_probe.csv")
                 if r["group"] == "all")
    assert (probe["n_verdicts"], probe["n_flipped"], round(float(probe["flip_rate_ci_high"]), 3)
            ) == ("32", "0", 0.107), probe
    app = [r for r in _read(tmp / "runs/tour/hiring-app/tables/exposed_vs_clean.csv")
           if r["field"] == "decision=older" and r["group"] == "all"]
    assert {(r["condition"], float(r["diff"]), int(r["n_pairs"])) for r in app} == {
        ("reviewer_a:pro_older", 1.0, 6), ("chair:pro_older", 1.0, 6)}, app


def test_a_second_tour_makes_no_model_calls(tour):
    """The same run into a new directory is answered from the cache, with the same tables."""
    tmp, _, env = tour
    line = next(c for c in commands(README.read_text())
                if c.startswith("biaslab run experiments/examples/review.toml"))
    again = line.replace("runs/tour/review", "runs/tour/review-again")
    proc = subprocess.run(["bash", "-c", f". .venv/bin/activate && {again} --quiet"], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    use = _read(tmp / "runs/tour/review-again/cache_use.csv")
    assert use and sum(int(r["calls"]) for r in use) > 0
    assert sum(int(r["model_calls"]) for r in use) == 0, "the second run paid for calls"
    first, second = tmp / "runs/tour/review/tables", tmp / "runs/tour/review-again/tables"
    for table in sorted(first.glob("*.csv")):
        assert (second / table.name).read_bytes() == table.read_bytes(), table.name


def test_the_viewer_line_serves_the_tour(tour):
    tmp, _, env = tour
    port = _free_port()
    proc = subprocess.Popen([str(VENV / "bin" / "biaslab"), "view", "runs/tour/review",
                             "--port", str(port)], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/meta", timeout=2) as r:
                    assert r.status == 200 and b"review" in r.read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_readme_links_exist():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local
    for link in local:
        assert (ROOT / link).exists(), f"README links to a missing file: {link}"


def test_the_readme_python_blocks_run_on_the_tour(tour):
    tmp, _, env = tour
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    assert blocks
    for block in blocks:
        proc = subprocess.run([str(VENV / "bin" / "python"), "-c", block], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{block}\n{proc.stderr[-2000:]}"
