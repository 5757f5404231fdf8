"""``--no-figures``: the same tables and a report.html, no figure drawn or shown."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import biaslab
from biaslab.cli import main
from biaslab.errors import UserError

REPO = Path(__file__).resolve().parents[2]
SPEC = str(REPO / "experiments/examples/review.toml")
MODEL = "scripted:review-synthetic"


def _tables(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes()
            for p in sorted((run_dir / "tables").rglob("*")) if p.is_file()}


def _figure_files(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / "figures").rglob("*") if p.is_file())


def _shows_figures(page: str) -> bool:
    return "<figure>" in page or "data:image/png" in page or "<svg" in page


def test_run_and_report_without_figures_write_the_same_tables(tmp_path, capsys):
    full, bare = tmp_path / "full", tmp_path / "bare"
    assert main(["run", SPEC, "--model", MODEL, "--out", str(full), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", SPEC, "--model", MODEL, "--out", str(bare), "--quiet",
                 "--no-figures"]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "figures" not in printed
    drawn = _figure_files(full)
    assert drawn and _shows_figures((full / "report.html").read_text())  # the run draws some
    tables = _tables(full)
    assert tables and _tables(bare) == tables
    assert _figure_files(bare) == []
    page = (bare / "report.html").read_text()
    assert not _shows_figures(page) and "figures/" not in page
    assert "not drawn (--no-figures)" in page

    # `report --no-figures` over a run whose figures are already there: the same tables, the
    # old figures left as they were (not redrawn) and not shown beside the new tables.
    kept = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in drawn}
    assert main(["report", str(full), "--no-figures"]) == 0
    assert _tables(full) == tables
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in _figure_files(full)} == kept
    assert not _shows_figures((full / "report.html").read_text())
    # and `report` without it draws them again
    assert main(["report", str(full)]) == 0
    assert _figure_files(full) == drawn and _shows_figures((full / "report.html").read_text())


def test_report_and_rescore_into_a_directory_without_figures(tmp_path):
    run = tmp_path / "run"
    assert main(["run", SPEC, "--model", MODEL, "--out", str(run), "--quiet",
                 "--no-figures"]) == 0
    tables = _tables(run)
    shutil.rmtree(run / "tables")
    (run / "report.html").unlink()
    assert main(["report", str(run), "--no-figures"]) == 0
    assert _tables(run) == tables and _figure_files(run) == []
    assert (run / "report.html").is_file()
    # the Python API's run and Run.report take the same option
    api = biaslab.run(SPEC, model=MODEL, out=tmp_path / "api", quiet=True, no_figures=True)
    assert _tables(api.path) == tables and _figure_files(api.path) == []
    with pytest.raises(UserError, match="no_figures goes with a report"):
        biaslab.run(SPEC, model=MODEL, out=tmp_path / "none", no_report=True, no_figures=True)
    written = biaslab.open_run(run).report(figures=False)
    assert run / "report.html" in written and _tables(run) == tables
    assert _figure_files(run) == [] and not any(p.suffix in (".png", ".svg") for p in written)

    out = tmp_path / "rescored"
    assert main(["replay", str(run), "--mode", "rescore", "--out", str(out),
                 "--no-figures"]) == 0
    assert _tables(out) == tables and _figure_files(out) == []
    assert not _shows_figures((out / "report.html").read_text())

    cf = tmp_path / "counterfactual"
    assert main(["replay", str(run), "--mode", "counterfactual", "--node", "revise",
                 "--directions", "pro_older", "--out", str(cf), "--quiet", "--no-figures"]) == 0
    assert (cf / "tables" / "compare_measures.csv").is_file() and _figure_files(cf) == []
    assert not _shows_figures((cf / "report.html").read_text())


@pytest.mark.parametrize("argv, why", [
    (["run", SPEC, "--no-report", "--no-figures"], "--no-report"),
    (["merge", "a", "b", "--out", "m", "--no-report", "--no-figures"], "--no-report"),
    (["replay", "r", "--mode", "strict", "--no-figures"], "--mode strict"),
])
def test_no_figures_where_no_report_is_written_is_refused(argv, why, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"biaslab: error: --no-figures goes with a report; {why} writes none\n"
    assert list(tmp_path.iterdir()) == []
