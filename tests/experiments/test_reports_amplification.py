"""Amplification report on a scripted run: the scatter figures' encodings and legends, and the
headline table that `biaslab run` / `biaslab report` print on the terminal."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import tomli_w
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from biaslab.cli import main
from biaslab.evaluators.amplification import CLEAN, amplification_verdict
from biaslab.experiments.reports.amplification import fbs_scatter_figure, target_markers
from support_runs import amplification_spec

OKABE_ITO = {"#e69f00", "#56b4e9", "#009e73", "#f0e442", "#0072b2", "#d55e00", "#cc79a7"}
PIPELINE_TARGETS = {
    "E0": {"prediction"},
    "E1": {"explanation", "prediction", "explanation+prediction"},
    "E2": {"explanation", "prediction", "judge", "explanation+prediction", "explanation+judge",
           "prediction+judge", "explanation+prediction+judge"},
}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One scripted run through `biaslab run`, with its captured stdout."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("amp")
    spec = amplification_spec()
    spec_path = tmp / "spec.toml"
    spec_path.write_text(tomli_w.dumps(spec))
    run_dir = tmp / "run"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("BIASLAB_CACHE", "off")
        code = main(["run", str(spec_path), "--out", str(run_dir), "--quiet"])
    assert code == 0
    return run_dir, out.getvalue()


def _signature(handle) -> tuple:
    if isinstance(handle, Patch):
        return ("patch", to_hex(handle.get_facecolor()))
    assert isinstance(handle, Line2D)
    return (handle.get_marker(), to_hex(handle.get_color()), handle.get_linestyle())


def _legend_entries(fig) -> list[tuple[str, str, tuple]]:
    """(legend title, label, handle signature) of every legend entry in the figure."""
    entries = []
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    for legend in legends:
        title = legend.get_title().get_text()
        for text, handle in zip(legend.get_texts(), legend.legend_handles):
            entries.append((title, text.get_text(), _signature(handle)))
    return entries


def test_scatter_legends_list_only_the_pipelines_targets(cli_run):
    run_dir, _ = cli_run
    agg = pd.read_csv(run_dir / "tables" / "aggregated.csv")
    for pipeline, expected in PIPELINE_TARGETS.items():
        fig = fbs_scatter_figure(agg.loc[agg["pipeline"] == pipeline])
        entries = _legend_entries(fig)
        targets = {label for title, label, _ in entries if "marker" in title}
        directions = {label for title, label, _ in entries if "colour" in title}
        assert targets == expected, pipeline
        assert {"pro_female", "pro_male", "clean run"} <= directions
        if pipeline == "E0":
            assert "explanation" not in targets and "judge" not in targets
        # no two entries look alike, whatever their kind
        signatures = [sig for _, _, sig in entries]
        assert len(set(signatures)) == len(signatures), entries
        # direction colours are colour-blind safe and differ from each other
        colours = {label: sig[1] for _, label, sig in entries if sig[0] == "patch"}
        assert set(colours.values()) <= OKABE_ITO
        assert colours["pro_female"] != colours["pro_male"]


def test_scatter_points_use_the_legend_encoding_and_bootstrap_error_bars(cli_run):
    run_dir, _ = cli_run
    agg = pd.read_csv(run_dir / "tables" / "aggregated.csv")
    e1 = agg.loc[agg["pipeline"] == "E1"]
    fig = fbs_scatter_figure(e1)
    entries = _legend_entries(fig)
    marker_of = {label: sig[0] for title, label, sig in entries if "marker" in title}
    colour_of = {label: sig[1] for _, label, sig in entries if sig[0] == "patch"}
    auc_ax = fig.axes[0]
    assert "AUC" in auc_ax.get_ylabel() and "FBS" in fig.axes[0].get_xlabel()
    exposed = e1.loc[(e1["target"] != CLEAN)].reset_index(drop=True)
    drawn = []
    for container in auc_ax.containers:  # one errorbar per exposed condition
        line = container.lines[0]
        (x,), (y,) = line.get_xdata(), line.get_ydata()
        (seg,) = container.lines[2][0].get_segments()
        drawn.append((line.get_marker(), to_hex(line.get_color()), x, y,
                      (seg[1][0] - seg[0][0]) / 2))
    assert len(drawn) == len(exposed)
    for rec in exposed.itertuples():
        want = (marker_of[rec.target], colour_of[rec.direction])
        match = [d for d in drawn if d[:2] == want]
        assert len(match) == 1, (rec.target, rec.direction)
        _, _, x, y, half_width = match[0]
        assert x == pytest.approx(rec.fbs) and y == pytest.approx(rec.auc)
        assert half_width == pytest.approx(rec.fbs_boot_std)  # ±1 bootstrap std


def test_figures_are_written_as_png_and_svg(cli_run):
    run_dir, stdout = cli_run
    agg = pd.read_csv(run_dir / "tables" / "aggregated.csv")
    for pipeline in PIPELINE_TARGETS:
        png = run_dir / "figures" / f"fbs_scatter_math_{pipeline}.png"
        svg = run_dir / "figures" / f"fbs_scatter_math_{pipeline}.svg"
        assert str(png) in stdout and str(svg) in stdout
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        text = svg.read_text()
        assert "<svg" in text and "pro_female" in text and "clean run" in text
        if pipeline == "E0":
            assert "explanation" not in text
    # with the report's shared markers a target looks the same in every pipeline's figure
    markers = target_markers(agg["target"])
    e1 = _legend_entries(fbs_scatter_figure(agg.loc[agg["pipeline"] == "E1"], markers=markers))
    e0 = _legend_entries(fbs_scatter_figure(agg.loc[agg["pipeline"] == "E0"], markers=markers))
    assert ({sig for _, label, sig in e0 if label == "prediction"}
            == {sig for _, label, sig in e1 if label == "prediction"})


def _table1_rows(run_dir):
    return pd.read_csv(run_dir / "tables" / "table1.csv", dtype=str, keep_default_na=False)


def _assert_headline(stdout: str, run_dir) -> None:
    assert "Table 1" in stdout
    t1 = _table1_rows(run_dir)
    model = t1.columns[-1]
    assert model in stdout
    lines = stdout.splitlines()
    for rec in t1.itertuples(index=False):
        cells = [str(v) for v in rec]
        # each Table 1 row is one line of the printed table, its cells in order
        pattern = r"\W+".join(re.escape(c) for c in cells)
        assert any(re.search(pattern, line) for line in lines), cells
    assert re.search(r"[+-]\d\.\d{3} ± \.\d{3}", stdout)


def test_run_prints_the_headline_table(cli_run):
    run_dir, stdout = cli_run
    _assert_headline(stdout, run_dir)


def test_report_prints_the_headline_table(cli_run, capsys, monkeypatch):
    run_dir, _ = cli_run
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    assert main(["report", str(run_dir), "--no-figures"]) == 0  # the fixture's figures stay
    out = capsys.readouterr().out
    assert "wrote " in out and "table1.md" in out
    _assert_headline(out, run_dir)


def test_report_superadditivity_tables_carry_both_readings(cli_run):
    run_dir, _ = cli_run
    per_seed = pd.read_csv(run_dir / "tables" / "superadditivity.csv")
    pooled = pd.read_csv(run_dir / "tables" / "superadditivity_over_seeds.csv")
    for frame in (per_seed, pooled):
        assert {"fbs_strongest_single_table1", "margin_over_strongest_single", "verdict",
                "superadditivity_sum_reading", "index_estimate", "index_ci_low",
                "index_ci_high", "verdict_sum"} <= set(frame.columns)
    agg = pd.read_csv(run_dir / "tables" / "aggregated.csv").set_index(
        ["pipeline", "target", "direction"])["fbs"]
    for rec in pooled.itertuples():
        each = [agg[(rec.pipeline, s, rec.direction)] for s in rec.target.split("+")]
        joint = agg[(rec.pipeline, rec.target, rec.direction)]
        assert rec.superadditivity_sum_reading == pytest.approx(joint - sum(each))
        assert rec.margin_over_strongest_single == pytest.approx(joint - max(each))
        assert rec.verdict == amplification_verdict(joint, each)


def test_report_gives_the_fbs_drop_of_ml_arbitration_beside_the_per_record_view(cli_run):
    run_dir, _ = cli_run
    drop = pd.read_csv(run_dir / "tables" / "ml_arbitration_fbs.csv")
    agg = pd.read_csv(run_dir / "tables" / "aggregated.csv").set_index(
        ["pipeline", "target", "direction"])["fbs"]
    # every target exposed in both E1 and E2, in both directions; no parse failures here, so
    # the common records are Table 1's and its FBS values subtract
    assert set(drop["target"]) == {"explanation", "prediction", "explanation+prediction"}
    for rec in drop.itertuples():
        assert rec.fbs_reference == pytest.approx(agg[("E1", rec.target, rec.direction)])
        assert rec.fbs_mitigated == pytest.approx(agg[("E2", rec.target, rec.direction)])
        assert rec.fbs_drop == pytest.approx(rec.fbs_reference - rec.fbs_mitigated)
        assert rec.fbs_drop_ci_low <= rec.fbs_drop <= rec.fbs_drop_ci_high
    per_record = pd.read_csv(run_dir / "tables" / "mitigation_effects.csv")
    assert "E2 vs E1" in set(per_record["variant"])
