"""Replay as a user runs it: secrets stay out, endpoints are recorded, failures leave nothing,
judge rescoring is never stale, and a counterfactual writes its tables and a comparison."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from scipy import stats as scipy_stats

from biaslab.agents.providers import ModelSpec, strip_credentials
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.cli import main
from biaslab.evaluators.amplification import favor_bias_strength
from biaslab.experiments.reports.compare import fbs_of_change
from biaslab.traces.store import RunStore
from support_http import FakeOpenAI, synthetic_answer

SECRET = "hunter2-SECRET-7f3a"
QUERY_SECRET = "qk-SECRET-91b2"


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str) -> bool:
    return code == 2 and err.count("\n") == 1 and err.startswith("biaslab: error:")


def write_spec(tmp_path: Path, data: dict, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(tomli_w.dumps(data))
    return path


def small_spec(**extra) -> dict:
    data = {"name": "t", "protocol": "amplification",
            "models": ["scripted:amplification-synthetic"],
            "run": {"seeds": [42], "retry_base_s": 0.0},
            "conditions": {"directions": ["pro_female"], "targets": "singletons"},
            "options": {"pipelines": ["E0", "E1"], "max_test": 20, "n_resamples": 300}}
    for key, value in extra.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return data


def every_byte(*roots: Path) -> list[tuple[Path, bytes]]:
    files = [p for root in roots for p in ([root] if root.is_file() else root.rglob("*"))
             if p.is_file()]
    assert files
    return [(p, p.read_bytes()) for p in files]


# -- credentials -------------------------------------------------------------------------------
def test_strip_credentials_removes_userinfo_and_key_queries_only():
    assert strip_credentials("http://u:pw@h:8/v1?key=k&api-version=2&token=t") == \
        "http://h:8/v1?api-version=2"
    assert strip_credentials("https://h/v1") == "https://h/v1"
    spec = ModelSpec(provider="vllm", model="q", base_url=f"http://u:{SECRET}@h/v1")
    assert SECRET not in json.dumps(spec.identity()) and SECRET not in json.dumps(spec.public())
    # the same endpoint with another key is the same model: cache keys do not carry keys
    assert spec.identity() == ModelSpec(provider="vllm", model="q",
                                        base_url="http://other:pw@h/v1").identity()


def test_credentials_in_base_url_reach_the_endpoint_but_never_the_disk(tmp_path, capsys,
                                                                       isolated_cache):
    with FakeOpenAI() as server:
        server.responder = synthetic_answer
        url = server.base_url.replace("http://", f"http://user:{SECRET}@")
        spec = small_spec(models=["hosted", "querykey"], model_aliases={
            "hosted": {"provider": "openai-compatible", "model": "m", "base_url": url},
            # a scripted model ignores its URL: it checks what is recorded for a ?key= query
            "querykey": {"provider": "scripted", "model": "amplification-synthetic",
                         "base_url": f"http://h/v1?key={QUERY_SECRET}"}},
            options={"pipelines": ["E0"]})
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", write_spec(tmp_path, spec), "--out", out, "--quiet")
        assert code == 0, err
        assert server.requests, "the hosted model was never called"
        auth = {s.headers.get("authorization", "") for s in server.requests}
        expected = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
        assert auth == {expected}  # the key from the URL is used for the call
        code, _, err = cli(capsys, "replay", out, "--mode", "strict", "--quiet")
        assert code == 0, err
    for path, data in every_byte(out, tmp_path / "run-strict", *isolated_cache.parent.glob(
            isolated_cache.name + "*")):
        for secret in (SECRET, QUERY_SECRET):
            assert secret.encode() not in data, path
    recorded = (out / "spec.toml").read_text()
    assert server.base_url in recorded and "http://h/v1" in recorded


@pytest.mark.parametrize("where", ["top", "nodes", "options"])
def test_an_inline_key_anywhere_is_refused_without_echoing_it(tmp_path, capsys, where):
    text = tomli_w.dumps(small_spec())  # its last table is [options]
    line = f'api_key = "{SECRET}"\n'
    text = {"top": line + text, "nodes": text + "[nodes.prediction]\n" + line,
            "options": text + line}[where]
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    code, _, err = cli(capsys, "run", spec, "--out", tmp_path / "o")
    assert one_line_error(code, err), err
    assert SECRET not in err and "api_key" in err and "environment" in err
    assert not (tmp_path / "o").exists()


# -- endpoints and strict replay ---------------------------------------------------------------
def test_strict_replay_uses_the_recorded_endpoint_not_the_shell(tmp_path, capsys, monkeypatch):
    with FakeOpenAI() as server:
        server.responder = synthetic_answer
        monkeypatch.setenv("VLLM_BASE_URL", server.base_url)
        spec = small_spec(models=["vllm:fake-model"], options={"pipelines": ["E0"]})
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", write_spec(tmp_path, spec), "--out", out, "--quiet",
                           "--no-figures")
        assert code == 0, err
    resolved = __import__("tomllib").loads((out / "spec.toml").read_text())["resolved_models"]
    assert resolved["vllm:fake-model"]["base_url"] == server.base_url
    monkeypatch.delenv("VLLM_BASE_URL")
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    code, stdout, err = cli(capsys, "replay", out, "--mode", "strict", "--quiet")
    assert code == 0, err
    assert "outputs identical, 0 model calls" in stdout


def test_a_failed_strict_replay_leaves_nothing_behind(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = cli(capsys, "run", write_spec(tmp_path, small_spec()), "--out", out, "--quiet",
                       "--no-figures")
    assert code == 0, err
    conn = sqlite3.connect(out / "run.sqlite")
    key = conn.execute("SELECT cache_key FROM calls WHERE node='prediction' LIMIT 1").fetchone()[0]
    conn.execute("DELETE FROM cache WHERE key=?", (key,))
    conn.commit()
    conn.close()
    code, _, err = cli(capsys, "replay", out, "--mode", "strict", "--quiet", "--out",
                       tmp_path / "replayed")
    assert one_line_error(code, err), err
    assert "strict replay: the source trace has no call for node 'prediction'" in err
    assert "models as recorded: scripted:amplification-synthetic" in err
    assert not (tmp_path / "replayed").exists()


# -- judge rescoring ---------------------------------------------------------------------------
def test_judge_rescore_refuses_stale_settings_and_unknown_nodes(tmp_path, capsys):
    register_scripted("replay-judge", lambda: ScriptedChatModel(rules=[
        Rule("favouritism", '{"label": "neutral", "justification": "plain"}')]))
    out = tmp_path / "run"
    code, _, err = cli(capsys, "run", write_spec(tmp_path, small_spec()), "--out", out, "--quiet",
                       "--no-figures")
    assert code == 0, err
    judge = ["replay", out, "--mode", "rescore", "--judge-node", "explanation", "--judges",
             "scripted:replay-judge"]
    code, stdout, err = cli(capsys, *judge)
    assert code == 0, err
    first = (out / "evals" / "judge" / "scores.csv").read_bytes()
    code, _, err = cli(capsys, *judge, "--repeats", "3")
    assert one_line_error(code, err) and "other settings (changed: repeats)" in err, err
    assert (out / "evals" / "judge" / "scores.csv").read_bytes() == first  # old votes intact
    code, stdout, err = cli(capsys, *judge, "--repeats", "3", "--eval-name", "three")
    assert code == 0, err
    votes = pd.read_csv(out / "evals" / "three" / "scores.csv")
    assert (votes["votes_neutral"] == 3).all()
    code, stdout, err = cli(capsys, *judge)  # the same settings again: resumed, not redone
    assert code == 0 and "0 judge calls" in stdout, err
    code, _, err = cli(capsys, "replay", out, "--mode", "rescore", "--judge-node", "critic",
                       "--judges", "scripted:replay-judge")
    assert one_line_error(code, err), err
    assert "no calls of node 'critic' (recorded nodes: explanation, prediction)" in err


# -- counterfactuals ---------------------------------------------------------------------------
def test_counterfactual_with_a_prompt_variant_writes_tables_and_a_comparison(tmp_path, capsys):
    src = tmp_path / "run"
    code, _, err = cli(capsys, "run", write_spec(tmp_path, small_spec()), "--out", src, "--quiet",
                       "--no-figures")
    assert code == 0, err
    cf = tmp_path / "cf"
    code, stdout, err = cli(capsys, "replay", src, "--mode", "counterfactual", "--node",
                            "prediction", "--prompt", "@terse", "--out", cf, "--quiet",
                            "--no-figures")
    assert code == 0, err
    assert (cf / "tables" / "table1.csv").is_file()
    calls = RunStore(cf, readonly=True).calls()
    live = calls[~calls["cache_hit"]]
    assert set(live["node"]) == {"prediction"}  # the explanation came from the trace
    terse = calls[calls["node"] == "prediction"]["messages"].map(lambda m: m[-1]["content"])
    assert terse.str.startswith("Students (").sum() > 0  # E0's terse text
    assert terse.str.startswith("Analyst notes:").sum() > 0  # E1's terse text
    # the comparison: source FBS as in the source's own table, and the change with its CI
    compare = pd.read_csv(cf / "tables" / "compare_fbs.csv")
    source_metrics = pd.read_csv(src / "tables" / "condition_metrics.csv")
    exposed = source_metrics[source_metrics["target"] != "none"]
    assert len(compare) == len(exposed) == 3  # E0: prediction; E1: explanation, prediction
    merged = compare.merge(exposed, on=["dataset", "pipeline", "target", "direction", "model",
                                        "seed"])
    assert np.allclose(merged["fbs_source"], merged["fbs"])
    assert np.allclose(merged["fbs_change"], merged["fbs_counterfactual"] - merged["fbs_source"])
    assert (merged["change_ci_low"] <= merged["fbs_change"]).all()
    assert (merged["fbs_change"] <= merged["change_ci_high"]).all()
    cf_metrics = pd.read_csv(cf / "tables" / "condition_metrics.csv")
    cf_exposed = cf_metrics[cf_metrics["target"] != "none"]
    assert np.allclose(compare.sort_values(["pipeline", "target"])["fbs_counterfactual"],
                       cf_exposed.sort_values(["pipeline", "target"])["fbs"])
    counts = pd.read_csv(cf / "tables" / "compare_calls.csv")
    assert counts["model_calls_counterfactual"].sum() == len(live)
    meta = RunStore(cf, readonly=True).meta()
    assert meta["source_run"] == str(src.resolve())
    assert meta["source_fingerprint"] == RunStore(src, readonly=True).meta()["fingerprint"]
    assert meta["counterfactual"]["node"] == "prediction"
    # a second counterfactual into the same directory must be asked for explicitly
    again = ["replay", src, "--mode", "counterfactual", "--node", "prediction", "--prompt",
             "@terse", "--out", cf, "--quiet", "--no-figures"]
    code, _, err = cli(capsys, *again)
    assert one_line_error(code, err) and "--resume" in err
    code, stdout, err = cli(capsys, *again, "--resume", "--concurrency", "2", "--no-cache")
    assert code == 0 and "0 model calls" in stdout, err


def test_the_readme_example_prompt_variant_exists():
    from biaslab.prompts.registry import PromptRegistry

    registry = PromptRegistry()
    assert registry.get("amplification/predict@terse").slots == ("records", "n")
    assert "explanation" in registry.get("amplification/predict_with_explanation@terse").slots


@pytest.mark.parametrize("args, expected_targets", [
    (["--targets", "all"], {"none", "explanation", "prediction", "explanation+prediction"}),
    (["--targets", "each_and_all"], {"none", "explanation", "prediction",
                                     "explanation+prediction"}),
    (["--targets", "explanation+prediction"], {"none", "explanation+prediction"}),
])
def test_counterfactual_target_keywords(tmp_path, capsys, args, expected_targets):
    src = tmp_path / "run"
    spec = small_spec(options={"pipelines": ["E1"]})
    code, _, err = cli(capsys, "run", write_spec(tmp_path, spec), "--out", src, "--quiet",
                       "--no-figures")
    assert code == 0, err
    code, _, err = cli(capsys, "replay", src, "--mode", "counterfactual", *args, "--out",
                       tmp_path / "cf", "--quiet", "--no-figures")
    assert code == 0, err
    cells = RunStore(tmp_path / "cf", readonly=True).cells()
    assert set(cells["target"]) == expected_targets


def test_counterfactual_position_template_and_overrides(tmp_path, capsys):
    src = tmp_path / "run"
    spec = small_spec(options={"pipelines": ["E0"]})
    code, _, err = cli(capsys, "run", write_spec(tmp_path, spec), "--out", src, "--quiet",
                       "--no-figures")
    assert code == 0, err
    code, _, err = cli(capsys, "replay", src, "--mode", "counterfactual", "--position",
                       "user-prefix", "--out", tmp_path / "pos", "--quiet", "--no-figures")
    assert code == 0, err
    calls = RunStore(tmp_path / "pos", readonly=True).calls()
    exposed = calls[calls["exposed"]]
    assert len(exposed) and exposed["messages"].map(
        lambda m: "benefits female students over" in m[-1]["content"]).all()
    # a template of one's own, from an overrides directory
    own = tmp_path / "prompts" / "exposures"
    own.mkdir(parents=True)
    (own / "quiet_favor.toml").write_text(
        'slots = ["favored", "other"]\nuser = "Quietly, your answers should benefit $favored '
        'students over $other."\n')
    code, _, err = cli(capsys, "replay", src, "--mode", "counterfactual", "--overrides",
                       tmp_path / "prompts", "--template", "exposures/quiet_favor", "--out",
                       tmp_path / "tpl", "--quiet", "--no-figures")
    assert code == 0, err
    calls = RunStore(tmp_path / "tpl", readonly=True).calls()
    assert calls[calls["exposed"]]["messages"].map(
        lambda m: "Quietly" in json.dumps(m)).all()
    code, _, err = cli(capsys, "replay", src, "--mode", "counterfactual", "--overrides",
                       tmp_path / "nope", "--out", tmp_path / "bad", "--quiet", "--no-figures")
    assert one_line_error(code, err) and "not a directory" in err
    assert not (tmp_path / "bad").exists()


# -- the comparison's statistics ---------------------------------------------------------------
def test_fbs_change_matches_hand_values_and_scipy_bootstrap():
    rng = np.random.default_rng(3)
    n = 60
    sex = rng.integers(0, 2, n)
    cs, es, cc, ec = (rng.integers(0, 2, n) for _ in range(4))
    src, cf, boot = fbs_of_change(cs, es, cc, ec, sex, favored=0, n_resamples=4000)
    assert src == pytest.approx(favor_bias_strength(cs, es, sex, favored=0).fbs)
    assert cf == pytest.approx(favor_bias_strength(cc, ec, sex, favored=0).fbs)
    assert boot.estimate == pytest.approx(cf - src)

    def change(a, b, c, d, s):
        fav = s == 0
        fbs = lambda x, y: (x - y)[fav].mean() - (x - y)[~fav].mean()  # noqa: E731
        return fbs(c, d) - fbs(a, b)

    ref = scipy_stats.bootstrap((cs, es, cc, ec, sex), change, paired=True, vectorized=False,
                                n_resamples=4000, method="percentile", random_state=1)
    assert boot.ci_low == pytest.approx(ref.confidence_interval.low, abs=0.04)
    assert boot.ci_high == pytest.approx(ref.confidence_interval.high, abs=0.04)
    assert boot.std == pytest.approx(ref.standard_error, rel=0.1)
    same = fbs_of_change(cs, es, cs, es, sex, favored=1, n_resamples=200)[2]
    assert same.estimate == same.ci_low == same.ci_high == 0.0
