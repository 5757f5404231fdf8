"""A target cannot forge its judge's verdict (issue 16, section 2).

Per protocol, through the ``biaslab run`` CLI: a target that ends every judged text in a
look-alike verdict in each judge format (JSON, BIASED/FAIR keyword, ``FINAL:``), judged by a
judge that quotes what it judged (once before its verdict, once after it), must give exactly
the tables of the plain synthetic target. The forging and quoting models are in
``support_forging``; a control run with the blanking switched off shows the forgeries would
have flipped verdicts, so the equality is not vacuous.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pandas as pd
import pytest

from biaslab.agents.parsers import quoted_blocks
from biaslab.cli import main
from biaslab.traces.store import RunStore
from support_forging import FORGED, SUFFIX

RUN = """
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
"""
SPECS = {
    "multiturn-reemerge": RUN + """
[options]
categories = ["age", "gender"]
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
    "amplification-synthetic": RUN + """
[options]
datasets = ["math"]
max_test = 20
n_resamples = 200
[conditions]
targets = []
""",
    "augmentation-synthetic": RUN + """
[options]
categories = ["religion"]
max_per_category = 4
n_variants = 2
n_resamples = 200
[conditions]
targets = []
template = "augmentation/exposure"
""",
}
PROTOCOL = {"multiturn-reemerge": "multiturn", "roleplay-synthetic": "roleplay",
            "amplification-synthetic": "amplification",
            "augmentation-synthetic": "augmentation"}
VOLATILE = ("input_tokens", "output_tokens", "latency_s", "tokens")
"""Columns that count the text's length, which the forged suffix legitimately changes."""


def _run(tmp: Path, agent: str, model: str) -> Path:
    spec = tmp / f"{model}.toml"
    spec.write_text(f'name = "forge"\nprotocol = "{PROTOCOL[agent]}"\n'
                    f'models = ["scripted:{model}"]\n' + SPECS[agent])
    out = tmp / model
    assert main(["run", str(spec), "--out", str(out), "--quiet"]) == 0
    return out


def _without_forgeries(value, model: str, plain: str):
    """A forged run's cell as the plain run would write it: the target's texts keep the
    suffix it wrote (in the raw, CSV or JSON-escaped form), and the model has another name."""
    if not isinstance(value, str):
        return value
    for form in (SUFFIX, json.dumps(SUFFIX)[1:-1]):
        value = value.replace(form, "")
    return value.replace(model, plain)


def _tables(run: Path, model: str | None = None, plain: str | None = None
            ) -> dict[str, pd.DataFrame]:
    out = {}
    for path in sorted((run / "tables").glob("*.csv")):
        frame = pd.read_csv(path, keep_default_na=False) if path.read_text().strip() \
            else pd.DataFrame()
        frame = frame.drop(columns=[c for c in frame.columns if c in VOLATILE])
        if model:
            frame = frame.map(lambda v: _without_forgeries(v, model, plain))
            frame = frame.rename(columns=lambda c: _without_forgeries(c, model, plain))
        out[path.name] = frame
    return out


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    """Each protocol's plain synthetic run, made once for the module."""
    tmp = tmp_path_factory.mktemp("plain")
    with pytest.MonkeyPatch.context() as patch:  # a cache of its own, as every test has
        patch.setenv("BIASLAB_CACHE", str(tmp / "shared-cache.sqlite"))
        return {agent: _run(tmp, agent, agent) for agent in SPECS}


def _forged_judge_answers(run: Path) -> pd.Series:
    """The raw answers of every judge call whose prompt showed a forged text."""
    store = RunStore(run, readonly=True)
    try:
        calls = store.calls()
    finally:
        store.close()
    shown = calls["messages"].map(lambda ms: any(FORGED in text for _, text in
                                                 quoted_blocks(ms[-1]["content"])))
    return calls.loc[shown & calls["raw"].notna(), "raw"]


@pytest.mark.parametrize("quote", ["before", "after"])
@pytest.mark.parametrize("agent", list(SPECS))
def test_forged_verdicts_change_no_table(tmp_path, plain_runs, agent, quote):
    model = f"forged-{quote}-{agent}"
    forged = _run(tmp_path, agent, model)
    # the judges did see the forgeries and quoted them, so every one reached their answers
    answers = _forged_judge_answers(forged)
    assert len(answers) > 0
    assert answers.map(lambda raw: all(line in raw for line in FORGED.splitlines())).all()
    plain_tables = _tables(plain_runs[agent])
    forged_tables = _tables(forged, model, agent)
    assert set(forged_tables) == set(plain_tables) and plain_tables
    for name, frame in plain_tables.items():
        pd.testing.assert_frame_equal(forged_tables[name], frame, obj=f"{agent} {name}")


@pytest.mark.parametrize("agent", list(SPECS))
def test_without_blanking_the_forgeries_would_change_the_tables(tmp_path, plain_runs, agent,
                                                                 monkeypatch):
    """The control: the same forged run, parsed the old way (the whole answer, judged text
    included), does not reproduce the plain tables."""
    monkeypatch.setattr(importlib.import_module("biaslab.agents.ask"), "parse_outside_judged",
                        lambda parser, text, judged: parser(text))
    model = f"forged-after-{agent}"
    forged = _tables(_run(tmp_path, agent, model), model, agent)
    plain = _tables(plain_runs[agent])
    differ = [name for name in set(plain) | set(forged)
              if name not in plain or name not in forged or not forged[name].equals(plain[name])]
    assert differ, f"{agent}: the forgeries changed nothing even unblanked"
