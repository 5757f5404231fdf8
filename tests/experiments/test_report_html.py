"""report.html: CIs folded into their values, every table and figure shown, viewer links."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pandas as pd

from biaslab.cli import main
from biaslab.experiments.reports.html import fold_cis, viewer_link
from biaslab.graphs.registry import get_protocol

REPO = Path(__file__).resolve().parents[2]


def test_fold_cis_follows_each_naming_convention():
    frame = pd.DataFrame({"model": ["m"], "cum_bias": [0.25], "cum_bias_ci_low": [0.1],
                          "cum_bias_ci_high": [0.4], "diff": [0.5], "ci_low": [-0.125],
                          "ci_high": [0.75], "DR%": [41.2], "DR_low": [35.0], "DR_high": [47.9],
                          "index_estimate": [0.2], "index_std": [0.1],
                          "index_ci_low": [0.05], "index_ci_high": [0.35]})
    out, folded = fold_cis(frame)
    assert list(out.columns) == ["model", "cum_bias", "diff", "DR%", "index_estimate",
                                 "index_std"]
    assert sorted(folded) == sorted(["cum_bias", "diff", "DR%", "index_estimate"])
    row = out.iloc[0]
    assert row["cum_bias"] == "0.250 [0.100, 0.400]"
    assert row["diff"] == "0.500 [-0.125, 0.750]"
    assert row["DR%"] == "41.200 [35, 47.900]"
    assert row["index_estimate"] == "0.200 [0.050, 0.350]"


def test_viewer_link_drops_missing_values_and_unknown_keys():
    url = viewer_link({"variant": "E1", "condition": "prediction:pro_female", "seed": 42.0,
                       "model": float("nan"), "fbs": 0.1})
    parsed = urlparse(url)
    assert parsed.netloc == "127.0.0.1:8765" and parsed.fragment.startswith("/cells?")
    assert parse_qs(parsed.fragment.split("?", 1)[1]) == {
        "variant": ["E1"], "condition": ["prediction:pro_female"], "seed": ["42"]}


def test_user_protocol_gets_every_table_in_a_self_contained_report(tmp_path):
    out = tmp_path / "review"
    assert main(["run", str(REPO / "experiments/examples/review.toml"), "--model",
                 "scripted:review-synthetic", "--out", str(out), "--quiet"]) == 0
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    for table in sorted((out / "tables").glob("*.csv")):
        assert f">tables/{table.name}<" in page, table.name
    assert not re.search(r"""(src|href)=["']https?://(?!127\.0\.0\.1)""", page)
    assert "<script src" not in page and "<link" not in page
    assert page.count("How to read this") >= 4  # run health + the three generic tables
    calls = pd.read_csv(out / "tables" / "calls_by_node.csv")
    assert f"{int(calls['calls'].sum()):,} calls" in page  # "cache hits: h of N calls"
    exposed = pd.read_csv(out / "tables" / "exposed_vs_clean.csv")
    assert page.count('class="vl"') >= len(exposed)  # each row links to its cells


def test_builtin_sections_name_files_their_reports_write(tmp_path):
    """Every declared table/figure glob of the built-in protocols is a file the protocol's
    README promises; a typo here would silently drop a section."""
    for name in ("amplification", "roleplay", "multiturn", "augmentation"):
        sections = get_protocol(name).report_sections()
        assert sections and all(s.how_to_read for s in sections)
        for s in sections:
            for pattern in (*s.tables, *s.figures):
                assert pattern.startswith(("tables/", "figures/")), (name, pattern)
