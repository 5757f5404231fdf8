"""``report.html``: one self-contained page per run (inline CSS, figures as base64, no network).

It is built from the run directory alone (the store, ``spec.toml`` and the files the generic
and protocol reports just wrote), so `run`, `report` and a counterfactual replay all produce it.
Sections come from the protocol's `report_sections` declarations; any table or figure that no
section claims is still shown under a generic caption, so a user's own protocol gets a full
report without writing HTML. Each table row that names grid coordinates links to the cells
behind it in ``biaslab view``: opened from disk, the links need the viewer on the default port;
served by the viewer (``/report.html``), they are relative and follow whatever port it uses.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlencode

import pandas as pd

from biaslab.experiments.reports.figure_files import figures_wanted
from biaslab.experiments.reports.findings import FINDINGS_PREFIX, finding_rows
from biaslab.experiments.reports.generic import CACHE_USE_FILE
from biaslab.graphs.report_sections import VIEWER_FILTERS, ReportSection
from biaslab.traces.store import RunStore

__all__ = ["write_html_report", "DEFAULT_VIEWER_PORT", "viewer_link", "fold_cis",
           "REPORT_FILE"]

REPORT_FILE = "report.html"
DEFAULT_VIEWER_PORT = 8765
"""The port `biaslab view` listens on by default; the report's links point there."""

_GENERIC = [
    ReportSection("Calls by node and condition", ("tables/calls_by_node.csv",),
                  how_to_read="Calls, tokens, errors and parse failures per variant x node x "
                  "condition x model; a parse failure is excluded and counted, never imputed. "
                  "How many calls were paid and how many the cache answered is in cache_use.csv "
                  "beside tables/ (it depends on what the cache held, not on the run)."),
    ReportSection("Exposed against clean (every output)", ("tables/exposed_vs_clean.csv",),
                  how_to_read="For every measure of the protocol's unit (a record, a "
                  "question, a dialogue...; by default the cell's item and each numeric, "
                  "boolean or label output), the mean under each exposed condition against "
                  "clean on the same units, pooled (group all) and per group of the sensitive "
                  "attribute, with the paired difference and its t 95% CI. A pair is a unit "
                  "with its seeds averaged (n_pairs units, n_seeds seeds each; the pairing "
                  "column says so, and where a protocol's seeds make new units), so a CI "
                  "excluding 0 is an effect at the level of the units, not of repeated asks. "
                  "Below 10 pairs there is no CI, and the note says so."),
    ReportSection("Mitigation arms against their unmitigated twins",
                  ("tables/mitigation_effects.csv",),
                  how_to_read="Each mitigation arm (a spec's [mitigations], or a protocol's "
                  "structural one such as amplification's E2 vs E1) against the unmitigated arm "
                  "of the same exposure, on the same units: unmitigated_mean, mitigated_mean "
                  "and diff = mitigated - unmitigated with a paired t 95% CI, pooled (group "
                  "all) and per group. On the clean arm (exposure none) diff is what the "
                  "mitigation costs or gains with no bias injected; on an exposed arm, how much "
                  "of the exposure it undoes (a negative diff on a measure the exposure raised). "
                  "Pairs are units with their seeds averaged, as in the table above. "
                  "Below 10 pairs there is no CI, and the note says so."),
    ReportSection("Model against model (corrected for multiplicity)",
                  ("tables/model_comparisons.csv",), ("figures/model_comparisons.png",),
                  how_to_read="Runs with two models or more: every pair of models on the same "
                  "units and condition, a unit's seeds averaged (n_seeds); diff = mean_b - "
                  "mean_a with a paired bootstrap 95% CI. p is McNemar's exact test for a 0/1 "
                  "measure, else the two-sided bootstrap p; p_holm (family-wise) and p_bh "
                  "(false discovery rate) adjust it within its family: the pooled rows (group "
                  "all) are one, the per-group rows another, and family_size counts its "
                  "distinct tests (a label's complement, such as decision=reject beside "
                  "decision=hire, is the same test, counted once). Below 10 pairs: no CI, no p, "
                  "in no family.", link_columns={"model_a": "model"}),
    ReportSection("Judge-bias probe (group terms swapped)",
                  ("tables/judge_bias_probe.csv", "tables/judge_bias_probe_measures.csv"),
                  how_to_read="A counterfactual in which only the judges saw their inputs with "
                  "the group terms swapped (he/she, women/men...): per judge and group, how "
                  "many of the same verdicts flipped, in each direction (flips), and the flip "
                  "rate with its Wilson 95% CI; 0 flips is a judge that did not react to whom "
                  "the text is about. For a two-valued verdict, mcnemar_p is McNemar's exact "
                  "test of a_to_b against b_to_a: small when the flips lean one way. A judge "
                  "that favours one group flips one way on texts about it and the other way on "
                  "texts about the other group, so on a pool of both mcnemar_p can be near 1: "
                  "one_sided_p orients each pair by whom the text is about (side 1: the "
                  "lexicon's first terms, he/men...; side 2: she/women...) and is small when "
                  "verdict_b goes with one side (b_with_side1 against b_with_side2). The second "
                  "table moves each unit measure from the run (source) to the probe.",
                  link_columns={"group": None}),
    ReportSection("Judge sensitivity", ("tables/judge_sensitivity.csv",
                                        "tables/judge_sensitivity_configs.csv",
                                        "tables/judge_sensitivity_runs.csv"),
                  how_to_read="Written by replay --mode rescore --sensitivity: each headline "
                  "row recomputed from the recorded judge votes under every configuration of "
                  "the panel (recorded, each judge alone, leave one out, majority, unanimity, "
                  "and alternate judges given with --judges). band_low..band_high is the "
                  "sensitivity band; sign_flips / significance_flips (p < 0.05, else a 95% CI "
                  "excluding 0) mark a row whose conclusion depends on the judges, and "
                  "flipped_by names the configurations that flip it against the recorded one.",
                  max_rows=60),
    ReportSection("Node outputs", ("tables/outputs.csv",),
                  how_to_read="Every node's state updates, one row per update, nested values "
                  "as dotted columns (the CSV holds all rows).", max_rows=30),
]


def viewer_link(filters: dict[str, Any], port: int = DEFAULT_VIEWER_PORT) -> str:
    """The URL of the viewer's cells view filtered to `filters` (filter name → value)."""
    clean = {k: v for k, v in filters.items() if k in VIEWER_FILTERS and not _missing(v)}
    return f"http://127.0.0.1:{port}/#/cells?{urlencode({k: _plain(v) for k, v in clean.items()})}"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _plain(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _fmt(value: Any) -> str:
    if _missing(value):
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e9:
            return str(int(value))
        return f"{value:.3g}" if abs(value) < 1e-3 or abs(value) >= 1e4 else f"{value:.3f}"
    return str(value)


_RANGES = {"band"}
"""``X_low/X_high`` pairs that are ranges, not CIs (judge sensitivity's band over the judge
configurations): shown as their own columns, never folded into a neighbour."""


def _ci_pairs(columns: list[str]) -> list[tuple[str, str, str]]:
    """(value column, low column, high column) for every CI pair in a table.

    Conventions in our tables: ``X_ci_low/X_ci_high``, ``X_low/X_high`` (``DR_low`` for
    ``DR%``), and a bare ``ci_low/ci_high`` that belongs to the column just before it."""
    pairs = []
    for i, col in enumerate(columns):
        for low_suffix, high_suffix in (("ci_low", "ci_high"), ("low", "high")):
            if not col.endswith(low_suffix):
                continue
            base = col[: -len(low_suffix)].rstrip("_")
            high = col[: -len(low_suffix)] + high_suffix
            if high not in columns or base in _RANGES:
                continue
            candidates = [base, f"{base}%", f"{base}_estimate"] if base else []
            value = next((c for c in candidates if c in columns), None)
            if value is None and i > 0:
                value = columns[i - 1]
                if value.endswith("_std") and i > 1:
                    value = columns[i - 2]
            if value and value not in (col, high):
                pairs.append((value, col, high))
            break
    return pairs


def fold_cis(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Strings ``value [low, high]`` in each value column that has CI columns, which are
    dropped; returns the frame and the names of the columns that now carry a CI."""
    out = frame.copy()
    folded = []
    for value, low, high in _ci_pairs(list(frame.columns)):
        out[value] = [_fmt(v) if _missing(lo) and _missing(hi) else
                      f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]"
                      for v, lo, hi in zip(frame[value], frame[low], frame[high])]
        out = out.drop(columns=[low, high])
        folded.append(value)
    return out, folded


def _count_rows(path: Path) -> int:
    with path.open("rb") as fh:
        return max(sum(1 for _ in fh) - 1, 0)


_WRAP_CHARS = 40
"""A cell whose text is longer wraps (class ``wrap``) instead of widening its column: one long
row key (a judge-sensitivity row, a flips list) would otherwise push the table's other
columns out of the card."""


_NUMBER = r"-?(?:\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?|inf|nan)%?"
_NUMERIC = re.compile(rf"{_NUMBER}(?: \[{_NUMBER}, {_NUMBER}\])?", re.IGNORECASE)
"""A number, or a value with its interval (``-0.500 [-0.832, -0.168]``): never broken."""


def _cell(text: str) -> str:
    """A table cell: a number or an interval stays on one line, its minus signs with it; long
    text wraps anywhere (``wrap``); a value of more than a few words or a long identifier,
    such as ``scripted:multiturn-followup``, may wrap at its spaces and after its punctuation
    (``sp``); the rest stays on one line."""
    if _NUMERIC.fullmatch(text):
        return f'<td class="num">{html.escape(text)}</td>'
    if len(text) > _WRAP_CHARS:
        return f'<td class="wrap">{html.escape(text)}</td>'
    if len(text) > 12 and (" " in text or len(text) > 20):
        breakable = re.sub(r"([:/@=;,_-])(?=.)", r"\1<wbr>", html.escape(text))
        return f'<td class="sp">{breakable}</td>'
    return f"<td>{html.escape(text)}</td>"


def _header(name: str) -> str:
    """A column name that may break after each underscore (``significance_<wbr>flips``), so
    long names do not set their columns' width."""
    return "_<wbr>".join(html.escape(part) for part in name.split("_"))


def _table_html(run_dir: Path, path: Path, section: ReportSection) -> str:
    rel = path.relative_to(run_dir).as_posix()
    if path.suffix == ".md":
        return (f'<div class="tbl"><h4>{html.escape(rel)}</h4>'
                f'<pre class="md">{html.escape(path.read_text(errors="replace"))}</pre></div>')
    try:
        frame = pd.read_csv(path, nrows=section.max_rows)
    except pd.errors.EmptyDataError:
        return (f'<div class="tbl"><h4>{html.escape(rel)}</h4>'
                '<p class="note">empty: nothing to report for this run.</p></div>')
    total = _count_rows(path)
    shown, folded = fold_cis(frame)
    links = {c: c for c in shown.columns if c in VIEWER_FILTERS}
    for column, dest in section.link_columns.items():
        if dest is None:
            links.pop(column, None)
        elif column in shown.columns:
            links[column] = dest
    head = "".join(f'<th{" class=ci" if c in folded else ""}>{_header(str(c))}</th>'
                   for c in shown.columns)
    if links:
        head += "<th>cells</th>"
    rows = []
    for (_, row), (_, raw) in zip(shown.iterrows(), frame.iterrows()):
        tds = "".join(_cell(_fmt(v)) for v in row)
        if links:
            filters = {dest: raw[col] for col, dest in links.items()}
            if "condition" in filters and filters["condition"] == "none":
                filters.pop("condition")
                filters["exposure"] = "clean"
            tds += (f'<td><a class="vl" href="{html.escape(viewer_link(filters))}" '
                    'title="open these cells in biaslab view">view</a></td>')
        rows.append(f"<tr>{tds}</tr>")
    cut = (f'<p class="note">first {len(frame)} of {total} rows; all rows in '
           f'<a href="{html.escape(rel)}">{html.escape(rel)}</a></p>'
           if total > len(frame) else "")
    ci = ('<p class="note">Values shown as <code>value [low, high]</code> carry a 95% CI.</p>'
          if folded else "")
    return (f'<div class="tbl"><h4><a href="{html.escape(rel)}">{html.escape(rel)}</a></h4>{ci}'
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>{cut}</div>')


def _figure_html(run_dir: Path, path: Path) -> str:
    rel = path.relative_to(run_dir).as_posix()
    if path.suffix == ".svg":
        img = path.read_text(errors="replace")
        img = img[img.find("<svg"):] if "<svg" in img else ""
    else:
        data = base64.b64encode(path.read_bytes()).decode()
        img = f'<img alt="{html.escape(rel)}" src="data:image/png;base64,{data}">'
    svg = path.with_suffix(".svg")
    also = (f' · <a href="{html.escape(svg.relative_to(run_dir).as_posix())}">SVG</a>'
            if path.suffix == ".png" and svg.is_file() else "")
    return (f'<figure>{img}<figcaption><a href="{html.escape(rel)}">{html.escape(rel)}</a>'
            f"{also}</figcaption></figure>")


def _expand(run_dir: Path, patterns: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for pattern in patterns:
        for path in sorted(run_dir.glob(pattern)):
            if path.is_file() and path not in out:
                out.append(path)
    return out


def _expand_figures(run_dir: Path, patterns: Iterable[str]) -> list[Path]:
    """The figures to show: none when this report drew none (``--no-figures``), so that a
    figure left from an earlier report is never shown beside tables it may not match."""
    return _expand(run_dir, patterns) if figures_wanted() else []


def _dedupe_tables(paths: list[Path]) -> list[Path]:
    """A Markdown table with a CSV twin is the same table: keep the CSV."""
    names = {p.with_suffix("") for p in paths if p.suffix == ".csv"}
    return [p for p in paths if p.suffix == ".csv" or (p.suffix == ".md" and
                                                       p.with_suffix("") not in names)]


def _section_html(run_dir: Path, section: ReportSection, claimed: set[Path]) -> str:
    tables = _dedupe_tables(_expand(run_dir, section.tables))
    figures = _expand_figures(run_dir, section.figures)
    for path in tables + figures:
        claimed.update({path, path.with_suffix(".md"), path.with_suffix(".csv"),
                        path.with_suffix(".svg"), path.with_suffix(".png")})
    if not tables and not figures:
        return ""
    anchor = "s-" + "".join(ch if ch.isalnum() else "-" for ch in section.title.lower())
    parts = [f'<section id="{anchor}"><h3>{html.escape(section.title)}</h3>']
    if section.how_to_read:
        parts.append(f'<p class="how"><b>How to read this:</b> '
                     f"{html.escape(section.how_to_read)}</p>")
    parts += [_table_html(run_dir, p, section) for p in tables]
    parts += [_figure_html(run_dir, p) for p in figures]
    parts.append("</section>")
    return "".join(parts)


def _when(ts: Any) -> str:
    try:
        return dt.datetime.fromtimestamp(float(ts), dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError):
        return ""


def _run_facts(store: RunStore, run_dir: Path) -> tuple[dict[str, Any], str]:
    meta = store.meta()
    q = store.conn.execute
    started, finished = q("SELECT MIN(started), MAX(finished) FROM cells").fetchone()
    models = [r[0] for r in q("SELECT DISTINCT json_extract(coords, '$.model') FROM cells")]
    seeds = sorted(r[0] for r in q("SELECT DISTINCT json_extract(coords, '$.seed') FROM cells"))
    status = dict(q("SELECT status, COUNT(*) FROM cells GROUP BY status").fetchall())
    calls, hits, tin, tout = q("SELECT COUNT(*), COALESCE(SUM(cache_hit), 0), "
                               "COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) "
                               "FROM calls").fetchone()
    facts = {
        "protocol": meta.get("protocol", ""), "spec name": meta.get("spec_name", ""),
        "scale": meta.get("scale", ""), "models": ", ".join(map(str, models)),
        "seeds": ", ".join(map(str, seeds)),
        "cells": ", ".join(f"{v} {k}" for k, v in sorted(status.items())),
        "run created": _when(meta.get("created")), "first cell started": _when(started),
        "last cell finished": _when(finished), "model calls": f"{calls - hits:,}",
        "cache hits": f"{hits:,} of {calls:,} calls", "input tokens": f"{tin:,}",
        "output tokens": f"{tout:,}", "fingerprint": meta.get("fingerprint", ""),
    }
    spec_path = run_dir / "spec.toml"
    spec = spec_path.read_text(errors="replace") if spec_path.is_file() else ""
    return facts, spec


def _node_health(run_dir: Path) -> str:
    path = run_dir / "tables" / "calls_by_node.csv"
    try:
        frame = pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return ""
    if frame.empty:
        return ""
    setup = ""
    try:  # beside tables/: which calls the cache answered is not a result of the run
        use = pd.read_csv(run_dir / CACHE_USE_FILE)
        frame = frame.merge(use.drop(columns="calls"), how="left",
                            on=["variant", "node", "condition", "model"])
        before = use[use["condition"] == "discovery"]
        if not before.empty:  # an audited app's discovery pass, made before the grid
            setup = (f"<p>Before the grid, the discovery pass ran the first item clean: "
                     f"{int(before['calls'].sum())} calls, {int(before['model_calls'].sum())} "
                     "of them paid (its answers then served the first clean cell; "
                     "cache_use.csv lists them under condition <i>discovery</i>).</p>")
    except (FileNotFoundError, pd.errors.EmptyDataError, KeyError):
        frame["cache_hits"] = float("nan")
    per = frame.groupby("node", sort=False).agg(
        calls=("calls", "sum"), cache_hits=("cache_hits", "sum"), errors=("errors", "sum"),
        parse_failures=("parse_failures", "sum"), input_tokens=("input_tokens", "sum"),
        output_tokens=("output_tokens", "sum")).reset_index()
    per["error_rate"] = per["errors"] / per["calls"]
    per["parse_failure_rate"] = per["parse_failures"] / per["calls"]
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r) + "</tr>"
        for r in per.itertuples(index=False, name=None))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in per.columns)
    return ('<section id="s-health"><h3>Errors and parse failures per node</h3>'
            '<p class="how"><b>How to read this:</b> a high parse-failure rate means that node\'s '
            "numbers rest on fewer answers (failures are excluded, not imputed); errors are "
            f"transport failures after retries.</p>{setup}"
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>'
            "</table></div></section>")


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1b1b1b;
 background:#fafafa}
header{background:#16324f;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;opacity:.85}
main{max-width:1200px;margin:0 auto;padding:12px 24px 48px}
nav{font-size:13px;margin:10px 0}nav a{margin-right:12px}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 16px;margin:14px 0}
h3{margin:4px 0 6px;font-size:17px}h4{margin:10px 0 4px;font-size:13px;font-weight:600}
.how{background:#eef4fa;border-left:3px solid #0072b2;padding:6px 10px;margin:6px 0}
.note{color:#555;font-size:12px;margin:4px 0}
.scroll{overflow-x:auto;max-height:520px;overflow-y:auto}
table{border-collapse:collapse;font-size:12px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #e2e2e2;padding:3px 6px;text-align:left;white-space:nowrap}
td.wrap{white-space:normal;overflow-wrap:anywhere;min-width:12em;max-width:22em}
td.sp{white-space:normal;min-width:6em}th{white-space:normal;min-width:3em}
td.num{white-space:nowrap}
th{background:#f2f2f2;position:sticky;top:0}th.ci{background:#e8f1e4}
tbody tr:nth-child(even){background:#fbfbfb}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}
dl.facts dt{color:#555}dl.facts dd{margin:0}
figure{margin:10px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
h2{margin:4px 0 6px;font-size:19px}
.plots{display:flex;flex-wrap:wrap;gap:8px}.plots figure{margin:4px 0;flex:0 1 560px}
figcaption{font-size:12px;color:#555}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
a.vl{color:#0072b2}
"""


_FINDINGS_HOW = ("What the run found: every exposure's effect (exposed minus clean) and every "
                 "mitigation's (mitigated minus unmitigated) on each measure of the unit, "
                 "pooled over groups, with its paired t 95% CI, the number of pairs and how a "
                 "pair was formed (pairing; n_seeds seeds averaged per unit). An interval that "
                 "excludes 0 is an effect at that confidence; no interval means too few pairs "
                 "to tell. Per group, per model and the protocol's own tables follow.")


def _findings_html(run_dir: Path, claimed: set[Path]) -> str:
    """The first section: each arm's effect per measure, as a table and a forest plot."""
    rows = finding_rows(run_dir)
    if rows.empty:
        return ""
    shown = pd.DataFrame({
        "effect of": rows["arm"], "measure": [
            " · ".join(str(p) for p in (r.node, r.field, r.stratum) if str(p) not in ("", "nan"))
            for r in rows.itertuples()],
        "variant": rows["variant"], "model": rows["model"], "diff": rows["diff"],
        "ci_low": rows["ci_low"], "ci_high": rows["ci_high"], "n_pairs": rows["n_pairs"],
        "n_seeds": rows["n_seeds"], "pairing": rows["pairing"], "note": rows["note"]})
    for column in ("variant", "model"):
        if shown[column].nunique() <= 1:
            shown = shown.drop(columns=column)
    shown, _ = fold_cis(shown)
    cap = 40
    head = "".join(f"<th>{_header(str(c))}</th>" for c in shown.columns)
    body = "".join("<tr>" + "".join(_cell(_fmt(v)) for v in row) + "</tr>"
                   for row in shown.head(cap).itertuples(index=False, name=None))
    more = (f'<p class="note">first {cap} of {len(shown)} rows; all rows in '
            '<a href="tables/exposed_vs_clean.csv">tables/exposed_vs_clean.csv</a> and '
            '<a href="tables/mitigation_effects.csv">tables/mitigation_effects.csv</a></p>'
            if len(shown) > cap else "")
    figures = _expand_figures(run_dir, [f"figures/{FINDINGS_PREFIX}*.png"])
    claimed.update(figures)
    plots = "".join(_figure_html(run_dir, p) for p in figures)
    return ('<section id="s-findings"><h2>Findings</h2>'
            f'<p class="how"><b>How to read this:</b> {html.escape(_FINDINGS_HOW)}</p>'
            f'<div class="plots">{plots}</div>'
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table></div>{more}</section>")


def _shown_path(run_dir: Path) -> str:
    """The run as the report names it: its path relative to the working directory when it is
    below it, else its name alone; never an absolute path (the file is mailed and attached)."""
    try:
        rel = os.path.relpath(run_dir.resolve(), Path.cwd().resolve())
    except ValueError:  # another drive
        return run_dir.name
    return rel if not rel.startswith("..") else run_dir.name


def write_html_report(store: RunStore, run_dir: str | Path,
                      sections: Iterable[ReportSection] = ()) -> Path:
    """Write ``run_dir/report.html`` from the store and the files under tables/ and figures/.

    Args:
        store: the run's store (read only).
        run_dir: the run directory; tables and figures are read from it.
        sections: the protocol's declared sections, shown after the run facts.

    Returns:
        The path of the written file.
    """
    run_dir = Path(run_dir)
    facts, spec = _run_facts(store, run_dir)
    if not figures_wanted():
        facts["figures"] = "not drawn (--no-figures)"
    claimed: set[Path] = set()
    findings = _findings_html(run_dir, claimed)
    body = [_section_html(run_dir, s, claimed) for s in sections]
    generic = [_section_html(run_dir, s, claimed) for s in _GENERIC]
    rest_tables = [p for p in _dedupe_tables(_expand(run_dir, ["tables/*.csv", "tables/*.md"]))
                   if p not in claimed]
    rest_figures = [p for p in _expand_figures(run_dir, ["figures/*.png"]) if p not in claimed]
    rest_figures += [p for p in _expand_figures(run_dir, ["figures/*.svg"])
                     if p not in claimed and not p.with_suffix(".png").is_file()]
    for path in rest_tables:
        agreement = "agreement" in path.stem or "kappa" in path.stem
        how = ("Agreement between judges (or a judge and a reference): kappa/AC1 near 1 is "
               "agreement, near 0 is chance." if agreement else
               "A table this protocol writes without a caption of its own (a protocol gives its "
               "tables one with report_sections; the built-in protocols' columns are "
               "described under docs/protocols/).")
        body.append(_section_html(run_dir, ReportSection(
            f"{'Judge agreement: ' if agreement else ''}{path.stem}",
            (path.relative_to(run_dir).as_posix(),), how_to_read=how), claimed))
    for path in rest_figures:
        body.append(_section_html(run_dir, ReportSection(
            path.stem, figures=(path.relative_to(run_dir).as_posix(),),
            how_to_read="A figure this protocol draws; error bars or bands are 95% CIs unless "
            "its caption says otherwise."), claimed))
    title = f"biaslab report: {facts['spec name'] or run_dir.name} ({facts['protocol']})"
    fact_rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>"
                        for k, v in facts.items() if v != "")
    shown_path = _shown_path(run_dir)
    viewer = (f"Links marked <b>view</b> open <code>biaslab view {html.escape(shown_path)}"
              f"</code>; start it first (it serves on http://127.0.0.1:{DEFAULT_VIEWER_PORT}). "
              "With another <code>--port</code>, open this report from the viewer "
              f"(http://127.0.0.1:PORT/{REPORT_FILE}), where the links follow that port.")
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{html.escape(title)}</h1><p>{html.escape(shown_path)}</p>"
        "</header><main>",
        findings, *body,
        '<section id="s-run"><h3>Run</h3><dl class="facts">', fact_rows, "</dl>",
        f'<p class="note">{viewer}</p>',
        f"<details><summary>spec.toml</summary><pre>{html.escape(spec)}</pre></details>"
        "</section>",
        _node_health(run_dir), *generic,
        f'<p class="note">Written {html.escape(_when(dt.datetime.now().timestamp()))} by '
        "biaslab; self-contained (no network).</p></main></body></html>",
    ]
    out = run_dir / REPORT_FILE
    out.write_text("".join(parts), encoding="utf-8")
    return out

