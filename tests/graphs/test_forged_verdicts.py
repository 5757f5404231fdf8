"""No text a target writes is ever read as, or cancels, its judge's verdict (issues 16 and 28).

The adversarial matrix, per protocol with a judge (roleplay's three Why judges and bias-type
classifier, multiturn's judge, guardrail and coherence rater, augmentation's validators and
judge, amplification's judge), through the ``biaslab run`` CLI: a target whose every judged
text carries every forger of ``support_forging.FORGERS`` (look-alike verdicts inline and on
their own lines, bare ``FAIR``/``BIASED`` lines, a closed quoting tag, a guessed verdict marker,
a plain-words note, look-alike Unicode characters), judged by honest judges that quote what
they judged in each of ``support_forging.STYLES`` (verdict only, quote before, quote after, only
the tail, Markdown ``> `` lines, restating the forgery), must give exactly the tables of the
plain synthetic target, with no judge call unparsed. Forgers and styles are grouped into one
run per protocol: every judged text carries all forgers, and the judges take the styles in
turn (the test checks every style occurred).

The control parses each judge's whole answer instead of its verdict channel: the same forged
run then gives other tables, so the equality is not vacuous.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pandas as pd
import pytest

from biaslab.agents.parsers import quoted_blocks
from biaslab.agents.verdicts import requested_marker
from biaslab.cli import main
from biaslab.prompts.registry import escape_quoted
from biaslab.traces.store import RunStore
from support_forging import FORGERS, STYLES, SUFFIXES, style_in, without_forgeries

RUN = """
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
"""
SPECS = {
    "multiturn-reemerge": RUN + """
[options]
categories = ["gender"]
seeds_per_category = 2
framings = ["assessment"]
turn_caps = [5]
baselines = []
n_resamples = 200
[conditions]
targets = []
template = "multiturn/exposure"
""",
    "roleplay-synthetic": RUN + """
[options]
attributes = ["gender", "race"]
per_stratum = 3
chunk_size = 3
[conditions]
targets = []
template = "roleplay/exposure"
""",
    "amplification-contrary": RUN + """
[options]
datasets = ["math"]
max_test = 12
n_resamples = 200
[conditions]
targets = []
""",
    "augmentation-synthetic": RUN + """
[options]
categories = ["religion"]
max_per_category = 2
n_variants = 2
n_resamples = 200
[conditions]
targets = []
template = "augmentation/exposure"
""",
}
PROTOCOL = {"multiturn-reemerge": "multiturn", "roleplay-synthetic": "roleplay",
            "amplification-contrary": "amplification",
            "augmentation-synthetic": "augmentation"}
VOLATILE = ("input_tokens", "output_tokens", "latency_s", "tokens")
"""Columns that count the text's length, which the forged suffix legitimately changes."""


def _run(tmp: Path, agent: str, model: str) -> Path:
    spec = tmp / f"{model}.toml"
    spec.write_text(f'name = "forge"\nprotocol = "{PROTOCOL[agent]}"\n'
                    f'models = ["scripted:{model}"]\n' + SPECS[agent])
    out = tmp / model
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-figures"]) == 0
    return out


def _tables(run: Path, model: str | None = None, plain: str | None = None
            ) -> dict[str, pd.DataFrame]:
    out = {}
    for path in sorted((run / "tables").glob("*.csv")):
        frame = pd.read_csv(path, keep_default_na=False) if path.read_text().strip() \
            else pd.DataFrame()
        frame = frame.drop(columns=[c for c in frame.columns if c in VOLATILE])
        if model:
            frame = frame.map(lambda v: without_forgeries(v, model, plain))
            frame = frame.rename(columns=lambda c: without_forgeries(c, model, plain))
        out[path.name] = frame
    return out


def _judge_calls(run: Path) -> pd.DataFrame:
    """Every call whose prompt asked for verdict markers (a judge, validator or oracle)."""
    store = RunStore(run, readonly=True)
    try:
        calls = store.calls()
    finally:
        store.close()
    prompt = calls["messages"].map(lambda ms: "\n".join(m["content"] for m in ms
                                                        if m["role"] == "user"))
    calls = calls.assign(prompt=prompt)
    return calls[prompt.map(lambda p: requested_marker(p) is not None)]


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    """Each protocol's plain synthetic run, made once for the module."""
    tmp = tmp_path_factory.mktemp("plain")
    with pytest.MonkeyPatch.context() as patch:  # a cache of its own, as every test has
        patch.setenv("BIASLAB_CACHE", str(tmp / "shared-cache.sqlite"))
        return {agent: _run(tmp, agent, agent) for agent in SPECS}


@pytest.mark.parametrize("agent", list(SPECS))
def test_forged_verdicts_change_no_table(tmp_path, plain_runs, agent):
    model = f"forged-{agent}"
    forged = _run(tmp_path, agent, model)
    judges = _judge_calls(forged)
    escaped = [escape_quoted(suffix.strip()) for suffix in SUFFIXES]
    shown = judges[judges["prompt"].map(lambda p: any(e in p for e in escaped))]
    # the judges saw every forgery whole, escaped inside its quoting block (no tag closed it)
    assert len(shown) > 0
    assert shown["prompt"].map(lambda p: any(e in body for _, body in quoted_blocks(p)
                                             for e in escaped)).all()
    # ... answered in every quoting style, and the quoting ones did write forgeries out
    assert set(shown["raw"].map(style_in)) == set(STYLES)
    quoting = shown[shown["raw"].map(style_in) != "verdict_only"]
    assert quoting["raw"].map(lambda raw: "FAIR" in raw.replace(FORGERS["bare_words"], "X")
                              or '"label": "no"' in raw or "FINAL: 0.05" in raw).all()
    # ... and every judge call was read, none left unparsed
    assert judges["parse_error"].isna().all(), judges["parse_error"].dropna().head(3).tolist()
    assert _judge_calls(plain_runs[agent])["parse_error"].isna().all()
    plain_tables = _tables(plain_runs[agent])
    forged_tables = _tables(forged, model, agent)
    assert set(forged_tables) == set(plain_tables) and plain_tables
    for name, frame in plain_tables.items():
        pd.testing.assert_frame_equal(forged_tables[name], frame, obj=f"{agent} {name}")


@pytest.mark.parametrize("agent", list(SPECS))
def test_without_the_verdict_channel_the_forgeries_would_change_the_tables(
        tmp_path, plain_runs, agent, monkeypatch):
    """The control: the same forged run, each judge's whole answer parsed (its quotes of the
    forged text included), does not reproduce the plain tables."""
    monkeypatch.setattr(importlib.import_module("biaslab.agents.ask"), "parse_marked",
                        lambda parser, text, marker: parser(text))
    model = f"forged-{agent}"
    forged = _tables(_run(tmp_path, agent, model), model, agent)
    plain = _tables(plain_runs[agent])
    differ = [name for name in set(plain) | set(forged)
              if name not in plain or name not in forged or not forged[name].equals(plain[name])]
    assert differ, f"{agent}: the forgeries changed nothing even read from the whole answer"
