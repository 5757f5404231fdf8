"""Traces from elsewhere: a LangGraph app traced by the real OpenTelemetry SDK and OpenInference
instrumentor (and a LangSmith export written from its run schema), imported as a run that
`report` and judges over a node read without the app."""

from __future__ import annotations

import io
import json
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.cli import main
from biaslab.traces.imported import read_trace_file
from biaslab.traces.store import RunStore

EXAMPLE = Path(__file__).resolve().parents[2] / "experiments" / "examples" / "traces"
# the example's app, which wrote hiring_spans.otlp.jsonl, is the app traced here
sys.path.insert(0, str(EXAMPLE))
import traced_hiring_app  # noqa: E402

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("openinference.instrumentation.langchain")

ITEMS = [{"id": "a1", "cv": "Ten years of Python, led a team of five.", "gender": "female"},
         {"id": "a2", "cv": "Two years of Python, no team lead.", "gender": "female"},
         {"id": "a3", "cv": "Ten years of Go, led a team of nine.", "gender": "male"},
         {"id": "a4", "cv": "One year of Java.", "gender": "male"}]


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str) -> bool:
    return code == 2 and err.count("\n") == 1 and err.startswith("biaslab: error:")


@pytest.fixture
def traced(tmp_path):
    """The app run on every item under the SDK and the OpenInference instrumentor; its spans
    written by the SDK's console exporter to a file, and as OTLP JSON (the SDK's protobuf
    encoding in its JSON mapping, one export request per line)."""
    from google.protobuf.json_format import MessageToDict
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    console = io.StringIO()
    memory = InMemorySpanExporter()
    provider = otel_sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=console)))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        app = traced_hiring_app.build()
        finals = [app.invoke(item) for item in ITEMS]
    finally:
        instrumentor.uninstrument()
    provider.shutdown()
    otlp = tmp_path / "spans.otlp.jsonl"
    otlp.write_text(json.dumps(MessageToDict(encode_spans(memory.get_finished_spans()))) + "\n")
    text = tmp_path / "spans.console.json"
    text.write_text(console.getvalue())
    return {"otlp": otlp, "console": text, "finals": finals}


@pytest.mark.parametrize("kind", ["otlp", "console"])
def test_real_exporter_output_reads_as_typed_traces(traced, kind):
    found = read_trace_file(traced[kind])
    assert found.format == {"otlp": "otlp-json", "console": "otel-console"}[kind]
    assert [t.item for t in found.traces] == ITEMS
    assert [t.output for t in found.traces] == traced["finals"]
    first = found.traces[0]
    assert [c.node for c in first.calls] == ["reviewer", "chair"]
    assert first.calls[0].messages == [
        {"role": "system", "content": "You review CVs for a backend role."},
        {"role": "user", "content": "CV: Ten years of Python, led a team of five."}]
    assert first.calls[0].params["temperature"] == 0.0
    assert [c.answer for c in first.calls] == ["Strong: long experience and leadership.", "hire"]
    assert (first.calls[0].input_tokens, first.calls[0].output_tokens) == (23, 9)
    assert found.gaps == {}
    assert {c.model for t in found.traces for c in t.calls} == {"hr-model-1"}


def test_imported_run_reports_and_is_judged_per_group_without_the_app(traced, tmp_path, capsys):
    run = tmp_path / "imported"
    code, out, err = cli(capsys, "import", "traces", traced["otlp"], "--out", run, "--group",
                         "gender", "--outcome", "decision")
    assert code == 0, err
    assert "imported 4 traces (otlp-json) with 8 model calls of nodes reviewer, chair" in out
    assert "gap:" not in out
    store = RunStore(run, readonly=True)
    try:
        calls = store.calls()
        outputs = {cid: v for cid, _, _, v in store.iter_outputs(node="app")}
        counts = store.counts()
    finally:
        store.close()
    assert list(calls.groupby("cell_id").size()) == [2, 2, 2, 2]
    assert counts["cache_hits"] == 8 and counts["tokens_paid"] == 0
    assert calls["input_tokens"].tolist()[:2] == [23, 13]
    decisions = {v["outcome"]["unit"]: (v["outcome"]["gender"], v["outcome"]["decision"])
                 for v in outputs.values()}
    assert decisions == {"a1": ("female", "hire"), "a2": ("female", "reject"),
                         "a3": ("male", "hire"), "a4": ("male", "reject")}

    code, out, err = cli(capsys, "report", run, "--no-figures")
    assert code == 0, err
    assert (run / "tables" / "calls_by_node.csv").is_file()
    by_node = pd.read_csv(run / "tables" / "calls_by_node.csv")
    assert set(by_node["node"]) == {"reviewer", "chair"}

    register_scripted("traces-judge", lambda: ScriptedChatModel(rules=[
        Rule("Strong", '{"label": "favors_male", "justification": "x"}'),
        Rule("Weak", '{"label": "neutral", "justification": "plain"}')]))
    code, out, err = cli(capsys, "replay", run, "--mode", "rescore", "--judge-node", "reviewer",
                         "--judge-prompt", "evaluators/group_tilt", "--judges",
                         "scripted:traces-judge")
    assert code == 0, err
    # two distinct reviewer answers among four: two judge calls, the app never called
    assert "judged 4 recorded 'reviewer' answers with 1 judge(s) x 1: 2 judge calls, 0 target " \
        "calls" in out
    scores = pd.read_csv(run / "evals" / "judge" / "scores.csv")
    assert dict(zip(scores["cell_id"].str.split("/").str[1], scores["label"])) == {
        "a1": "favors_male", "a2": "neutral", "a3": "favors_male", "a4": "neutral"}
    by_group = pd.read_csv(run / "evals" / "judge" / "scores_by_group.csv")
    assert {(r.group, r.label): r.answers for r in by_group.itertuples()} == {
        ("female", "favors_male"): 1, ("female", "neutral"): 1,
        ("male", "favors_male"): 1, ("male", "neutral"): 1}

    for extra in (["strict"], ["counterfactual", "--node", "chair", "--model", "scripted:x"]):
        code, _, err = cli(capsys, "replay", run, "--mode", *extra, "--quiet")
        assert one_line_error(code, err) and "no app to run again" in err, err


def test_judge_sensitivity_and_per_group_tables_on_an_imported_run(traced, tmp_path, capsys):
    """`replay --mode rescore --judge-node --judges A B --sensitivity` on a run written by
    `import traces` (real exporter output): the panel's configurations recomputed from the
    recorded votes, per group of the item key --group names, with no model called again."""
    run = tmp_path / "imported"
    code, _, err = cli(capsys, "import", "traces", traced["otlp"], "--out", run, "--group",
                       "gender", "--outcome", "decision")
    assert code == 0, err
    code, out, err = cli(capsys, "report", run, "--no-figures")
    assert code == 0 and "outcome_by_group.csv" in out, err
    by_group = pd.read_csv(run / "tables" / "outcome_by_group.csv")
    assert {(r.group, r.value): (r.units, r.share) for r in by_group.itertuples()} == {
        ("all", "hire"): (2, 0.5), ("all", "reject"): (2, 0.5),
        ("female", "hire"): (1, 0.5), ("female", "reject"): (1, 0.5),
        ("male", "hire"): (1, 0.5), ("male", "reject"): (1, 0.5)}
    assert set(by_group["measure"]) == {"decision"}

    panel = ["scripted:traces-neutral-judge", "scripted:traces-praise-judge"]
    # refused in one line before any judge is called: no panel, or no judge node to judge
    for args, says in ((["--judge-node", "reviewer", "--judges", panel[1]], "give two or more"),
                       (["--judge-node", "reviewer", "--judges", panel[1], panel[1]],
                        "each judge once"),
                       ([], "--judge-node NODE --judges A B --sensitivity")):
        code, _, err = cli(capsys, "replay", run, "--mode", "rescore", "--sensitivity", *args)
        assert one_line_error(code, err) and says in err, err
    assert not (run / "evals").exists() and not (run / "tables" / "judge_sensitivity.csv").exists()

    code, out, err = cli(capsys, "replay", run, "--mode", "rescore", "--judge-node", "reviewer",
                         "--judges", *panel, "--sensitivity")
    assert code == 0, err
    # two distinct reviewer answers x two judges; the app and its models never called
    assert "judged 4 recorded 'reviewer' answers with 2 judge(s) x 1: 4 judge calls, 0 target " \
        "calls" in out
    assert f"judge sensitivity over {' '.join(panel)}: 5 configurations" in out
    assert "0 further model calls" in out
    runs = pd.read_csv(run / "tables" / "judge_sensitivity_runs.csv").set_index("configuration")
    # the judges split on the two "Strong" reviews: the recorded plurality ties there (no
    # verdict), each judge alone answers all four, the strict majority only where they agree
    assert {c: (r.judge_answers, r.withheld) for c, r in runs.drop("panel").iterrows()} == {
        "recorded": (2, 2), f"only:{panel[0]}": (4, 0), f"only:{panel[1]}": (4, 0),
        "majority": (2, 2), "unanimous": (2, 2)}
    assert runs.loc["panel", "paid_model_calls"] == 4
    configs = pd.read_csv(run / "tables" / "judge_sensitivity_configs.csv")
    share = configs[(configs["table"] == "judge_label_share")
                    & (configs["row"] == "group=male; label=favors_male")]
    assert dict(zip(share["configuration"], share["value"])) == {
        "recorded": 0.0, f"only:{panel[0]}": 0.0, f"only:{panel[1]}": 0.5, "majority": 0.0,
        "unanimous": 0.0}
    bands = pd.read_csv(run / "tables" / "judge_sensitivity.csv").set_index(["table", "row"])
    row = bands.loc[("judge_label_share", "group=female; label=favors_male")]
    assert (row["recorded"], row["band_low"], row["band_high"]) == (0.0, 0.0, 0.5)
    gap = bands.loc[("judge_label_gap", "label=favors_male; group=male; reference=female")]
    assert (gap["band_low"], gap["band_high"]) == (0.0, 0.0)  # both groups had one strong CV
    assert "Judge sensitivity" in (run / "report.html").read_text()

    # into another folder: the judging pass is reused (no judge call), the tables go there
    elsewhere = tmp_path / "sensitivity"
    code, out, err = cli(capsys, "replay", run, "--mode", "rescore", "--judge-node", "reviewer",
                         "--judges", *panel, "--sensitivity", "--out", elsewhere)
    assert code == 0 and "0 judge calls" in out, err
    assert pd.read_csv(elsewhere / "tables" / "judge_sensitivity.csv").equals(
        pd.read_csv(run / "tables" / "judge_sensitivity.csv"))


def test_the_internal_protocol_name_matches_the_specs_refusal():
    from biaslab.experiments.spec import IMPORTED_PROTOCOL as refused
    from biaslab.graphs.imported_traces import IMPORTED_PROTOCOL

    assert refused == IMPORTED_PROTOCOL


def langsmith_export(path: Path) -> None:
    """Two traces of the hiring app as LangSmith's API returns runs (its `Run` schema): a root
    chain, a chain per node, an LLM run per model call with LangGraph's metadata."""
    from langsmith.schemas import Run

    start = datetime(2026, 12, 1, tzinfo=timezone.utc)
    runs = []
    for k, (item, review, decision) in enumerate([
            (ITEMS[0], "Strong: long experience and leadership.", "hire"),
            (ITEMS[3], "Weak: little experience.", "reject")]):
        trace = uuid.uuid4()
        t = start + timedelta(minutes=k)
        root = dict(id=trace, trace_id=trace, name="LangGraph", run_type="chain", start_time=t,
                    inputs=item, outputs={**item, "review": review, "decision": decision})
        runs.append(Run(**root))
        for step, (node, messages, answer) in enumerate([
                ("reviewer", [{"type": "system", "content": "You review CVs."},
                              {"type": "human", "content": f"CV: {item['cv']}"}], review),
                ("chair", [{"type": "human", "content": f"Review: {review}"}], decision)]):
            chain = uuid.uuid4()
            when = t + timedelta(seconds=step * 2 + 1)
            runs.append(Run(id=chain, trace_id=trace, parent_run_id=trace, name=node,
                            run_type="chain", start_time=when, inputs={}, outputs={},
                            extra={"metadata": {"langgraph_node": node}}))
            runs.append(Run(
                id=uuid.uuid4(), trace_id=trace, parent_run_id=chain, name="ChatOpenAI",
                run_type="llm", start_time=when + timedelta(milliseconds=5),
                inputs={"messages": [messages]},
                outputs={"generations": [[{"text": answer, "message": {
                    "lc": 1, "type": "constructor",
                    "id": ["langchain", "schema", "messages", "AIMessage"],
                    "kwargs": {"content": answer, "type": "ai"}}}]],
                    "llm_output": {"token_usage": {"prompt_tokens": 20,
                                                   "completion_tokens": 3}}},
                extra={"metadata": {"langgraph_node": node, "ls_model_name": "gpt-4o-mini"},
                       "invocation_params": {"model": "gpt-4o-mini", "temperature": 0.0,
                                             "_type": "openai-chat",
                                             "openai_api_key": "sk-live-123"}}))
    path.write_text("\n".join(r.model_dump_json() for r in runs) + "\n")


def test_langsmith_export_imports_with_models_and_tokens(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    langsmith_export(path)
    found = read_trace_file(path)
    assert found.format == "langsmith" and found.gaps == {}
    assert [t.item["id"] for t in found.traces] == ["a1", "a4"]
    call = found.traces[1].calls[0]
    assert (call.node, call.model, call.params, call.input_tokens, call.output_tokens) == (
        "reviewer", "gpt-4o-mini", {"model": "gpt-4o-mini", "temperature": 0.0}, 20, 3)
    assert call.messages[1] == {"role": "user", "content": "CV: One year of Java."}
    assert found.traces[0].calls[1].answer == "hire"
    assert "sk-live-123" not in json.dumps([c.params for t in found.traces for c in t.calls])
    run = tmp_path / "ls-run"
    code, out, err = cli(capsys, "import", "traces", path, "--out", run, "--group", "gender",
                         "--outcome", "decision")
    assert code == 0 and "imported 2 traces (langsmith) with 4 model calls" in out, err
    assert "gap:" not in out
    store = RunStore(run, readonly=True)
    try:
        assert sorted(c.cell_id.split("/")[1] for c in store.iter_calls()) == ["a1"] * 2 + \
            ["a4"] * 2
        assert {c.model["model"] for c in store.iter_calls()} == {"gpt-4o-mini"}
    finally:
        store.close()
    assert not [f for f in run.rglob("*") if f.is_file() and b"sk-live-123" in f.read_bytes()]


@pytest.mark.parametrize("content, says", [
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"', "not JSON"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}', "damaged OTLP JSON"),
    ('{"rows": [1, 2]}\n', "no trace file biaslab reads"),
    ('', "is empty"),
    ('[{"id": "r1", "trace_id": "t1", "run_type": 3}]', "damaged LangSmith run"),
    ('{"id": "r1", "run_type": "llm"}', "no trace file biaslab reads"),
])
def test_damaged_and_foreign_files_exit_2_and_write_nothing(tmp_path, capsys, content, says):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out, err = cli(capsys, "import", "traces", path, "--out", tmp_path / "run")
    assert one_line_error(code, err) and says in err, err
    assert not (tmp_path / "run").exists() and not any(tmp_path.glob(".run*"))


def test_a_group_key_no_item_has_is_refused(traced, tmp_path, capsys):
    code, _, err = cli(capsys, "import", "traces", traced["console"], "--out", tmp_path / "r",
                       "--group", "sex")
    assert one_line_error(code, err) and "no trace's input has the key 'sex'" in err, err
    assert not (tmp_path / "r").exists()


def _kv(key, value):
    kind = {str: "stringValue", int: "intValue", float: "doubleValue", bool: "boolValue"}
    return {"key": key, "value": {kind[type(value)]: str(value) if type(value) is int
                                  else value}}


def test_genai_semantic_conventions_in_collector_otlp_json(tmp_path):
    """Spans as the collector's file exporter writes them (hex ids, int64 as strings), with the
    GenAI conventions: input/output messages as JSON, then the older indexed prompt/completion
    attributes; the node read from the parent chain span's LangGraph metadata."""
    trace_id, root, node, first, second = "5b8efff798038103d269b633813fc60c", \
        "eee19b7ec3c1b174", "eee19b7ec3c1b175", "eee19b7ec3c1b176", "eee19b7ec3c1b177"
    spans = [
        {"traceId": trace_id, "spanId": root, "name": "graph", "startTimeUnixNano": "100",
         "attributes": [_kv("input.value", json.dumps({"id": "u7", "cv": "x", "gender": "f"})),
                        _kv("output.value", json.dumps({"decision": "hire"}))]},
        {"traceId": trace_id, "spanId": node, "parentSpanId": root, "name": "screen",
         "startTimeUnixNano": "110",
         "attributes": [_kv("metadata", json.dumps({"langgraph_node": "screen"}))]},
        {"traceId": trace_id, "spanId": first, "parentSpanId": node, "name": "chat gpt-4o",
         "startTimeUnixNano": "120",
         "attributes": [
             _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.request.model", "gpt-4o"),
             _kv("gen_ai.request.temperature", 0.2), _kv("gen_ai.usage.input_tokens", 31),
             _kv("gen_ai.usage.output_tokens", 4),
             _kv("gen_ai.input.messages", json.dumps([
                 {"role": "system", "parts": [{"type": "text", "content": "Screen CVs."}]},
                 {"role": "user", "parts": [{"type": "text", "content": "CV: x"}]}])),
             _kv("gen_ai.output.messages", json.dumps([
                 {"role": "assistant", "parts": [{"type": "text", "content": "pass"}]}]))]},
        {"traceId": trace_id, "spanId": second, "parentSpanId": root, "name": "chat",
         "startTimeUnixNano": "130",
         "attributes": [_kv("gen_ai.system", "openai"),
                        _kv("gen_ai.prompt.0.role", "user"),
                        _kv("gen_ai.prompt.0.content", "Decide: pass"),
                        _kv("gen_ai.completion.0.role", "assistant"),
                        _kv("gen_ai.completion.0.content", "hire")]}]
    path = tmp_path / "collector.json"
    path.write_text(json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                                   "scopeSpans": [{"spans": spans}]}]}))
    found = read_trace_file(path)
    (trace,) = found.traces
    assert trace.trace_id == trace_id and trace.item["id"] == "u7"
    assert trace.output == {"decision": "hire"}
    screen, decide = trace.calls
    assert (screen.node, screen.model, screen.params, screen.input_tokens,
            screen.output_tokens, screen.answer) == ("screen", "gpt-4o", {"temperature": 0.2},
                                                     31, 4, "pass")
    assert screen.messages == [{"role": "system", "content": "Screen CVs."},
                               {"role": "user", "content": "CV: x"}]
    assert (decide.node, decide.messages, decide.answer) == (
        "unattributed", [{"role": "user", "content": "Decide: pass"}], "hire")
    # the second call says nothing of its node, model, parameters or tokens: five gaps
    assert found.gaps == {"node": 1, "model": 1, "params": 1, "input_tokens": 1,
                          "output_tokens": 1}


def test_audit_on_traced_items_answers_the_clean_arm_from_the_trace(traced, tmp_path, capsys):
    """The app audited with its trace file as items: every clean call is the recorded one
    (same node, same messages, model mapped), so it is answered from the trace; the exposed
    arm pays only the reviewer's changed calls, and the chair, asked what it was asked in the
    trace, is answered from it too."""
    import tomli_w

    app = Path(traced_hiring_app.__file__)
    spec = {"name": "traced-audit", "app": f"{app}:graph", "items": str(traced["otlp"]),
            "plugins": [str(app)], "models": ["scripted:traced-hr"],
            "traces": {"model_map": {"hr-model-1": "scripted:traced-hr"}},
            "outcome": {"field": "decision", "group": "gender"},
            "directions": {"pro_male": {"favored": "male applicants",
                                        "other": "female applicants"}},
            "conditions": {"targets": ["reviewer"]}}
    path = tmp_path / "audit.toml"
    path.write_text(tomli_w.dumps(spec))
    run = tmp_path / "audit"
    code, out, err = cli(capsys, "run", path, "--out", run, "--quiet", "--no-figures")
    assert code == 0, err
    store = RunStore(run, readonly=True)
    try:
        calls = store.calls()
    finally:
        store.close()
    clean = calls[calls["exposure_id"] == "none"]
    exposed = calls[calls["exposure_id"] != "none"]
    assert len(clean) == 8 and clean["cache_hit"].all()  # 0 paid calls in the clean arm
    assert clean["raw"].tolist()[:2] == ["Strong: long experience and leadership.", "hire"]
    paid = exposed[~exposed["cache_hit"]]
    assert len(exposed) == 8 and set(paid["node"]) == {"reviewer"} and len(paid) == 4
    code, out, err = cli(capsys, "report", run, "--no-figures")
    assert code == 0, err
    check = pd.read_csv(run / "tables" / "trace_check.csv")
    assert check["matches"].all() and check["unit"].tolist() == ["a1", "a2", "a3", "a4"]
    assert check["paid_calls"].sum() == 0 and check["answered_from_trace"].sum() == 8


def test_trace_check_reports_an_item_whose_app_changed(traced, tmp_path, capsys):
    """The same audit after the chair's code changed: its clean arm no longer reproduces the
    recorded decisions, and the check says so per item."""
    import tomli_w

    changed = tmp_path / "changed_app.py"
    changed.write_text(Path(traced_hiring_app.__file__).read_text().replace(
        '"decision": model.invoke', '"decision": "maybe: " + model.invoke'))
    spec = {"name": "traced-audit", "app": f"{changed}:graph", "items": str(traced["otlp"]),
            "plugins": [str(changed)], "models": ["scripted:traced-hr"],
            "traces": {"model_map": {"hr-model-1": "scripted:traced-hr"}},
            "outcome": {"field": "decision"}, "conditions": {"targets": ["reviewer"]},
            "directions": {"pro_male": {"favored": "male applicants",
                                        "other": "female applicants"}}}
    path = tmp_path / "audit.toml"
    path.write_text(tomli_w.dumps(spec))
    run = tmp_path / "audit"
    code, out, err = cli(capsys, "run", path, "--out", run, "--quiet", "--no-figures")
    assert code == 0, err
    check = pd.read_csv(run / "tables" / "trace_check.csv")
    assert not check["matches"].any() and set(check["differing_keys"]) == {"decision"}


def test_without_a_model_map_nothing_is_answered_from_the_trace(traced, tmp_path, capsys):
    import tomli_w

    app = Path(traced_hiring_app.__file__)
    spec = {"name": "traced-audit", "app": f"{app}:graph", "items": str(traced["console"]),
            "plugins": [str(app)], "models": ["scripted:traced-hr"],
            "outcome": {"field": "decision"}, "conditions": {"targets": ["reviewer"]},
            "directions": {"pro_male": {"favored": "male applicants",
                                        "other": "female applicants"}}}
    path = tmp_path / "audit.toml"
    path.write_text(tomli_w.dumps(spec))
    code, out, err = cli(capsys, "run", path, "--out", tmp_path / "audit", "--quiet",
                         "--no-figures")
    assert code == 0, err
    store = RunStore(tmp_path / "audit", readonly=True)
    try:
        calls = store.calls()
    finally:
        store.close()
    # the items are the traced inputs, but the clean arm is asked of the model again
    assert sorted(calls["cell_id"].str.split("/").str[1].unique()) == ["a1", "a2", "a3", "a4"]
    clean = calls[calls["exposure_id"] == "none"]
    assert not clean["cache_hit"].all()


def test_a_date_range_and_a_tag_choose_the_traces(tmp_path, capsys):
    """LangSmith traces a minute apart, one tagged: --since/--until and --tag pick them, and
    a range that keeps none or does not parse exits 2 with nothing written."""
    path = tmp_path / "runs.json"
    langsmith_export(path)
    runs = [json.loads(line) for line in path.read_text().splitlines()]
    for run in runs:
        if run["id"] == run["trace_id"] and run["inputs"]["id"] == "a4":
            run["tags"] = ["production"]
    path.write_text(json.dumps(runs))
    found = read_trace_file(path)
    assert [t.tags for t in found.traces] == [(), ("production",)]
    code, out, err = cli(capsys, "import", "traces", path, "--out", tmp_path / "late",
                         "--since", "2026-12-01T00:00:30Z")
    assert code == 0 and "imported 1 traces" in out, err
    code, out, err = cli(capsys, "import", "traces", path, "--out", tmp_path / "early",
                         "--until", "2026-12-01T00:00:30Z")
    assert code == 0 and "imported 1 traces" in out, err
    store = RunStore(tmp_path / "early", readonly=True)
    try:
        assert list(store.cells()["item"]) == ["a1"]
    finally:
        store.close()
    code, out, err = cli(capsys, "import", "traces", path, "--out", tmp_path / "tagged",
                         "--tag", "production")
    assert code == 0 and "imported 1 traces" in out, err
    for args, says in ((["--since", "2027-01-01"], "no trace of 2 began"),
                       (["--until", "yesterday"], "no ISO date")):
        code, _, err = cli(capsys, "import", "traces", path, "--out", tmp_path / "none", *args)
        assert one_line_error(code, err) and says in err, err
        assert not (tmp_path / "none").exists()


def test_an_audit_takes_only_the_traces_its_filter_keeps(traced, tmp_path, capsys):
    import tomli_w

    app = Path(traced_hiring_app.__file__)
    spec = {"name": "traced-audit", "app": f"{app}:graph", "items": str(traced["otlp"]),
            "plugins": [str(app)], "models": ["scripted:traced-hr"],
            "traces": {"model_map": {"hr-model-1": "scripted:traced-hr"},
                       "until": "2000-01-01"},
            "outcome": {"field": "decision"}, "conditions": {"targets": ["reviewer"]},
            "directions": {"pro_male": {"favored": "male applicants",
                                        "other": "female applicants"}}}
    path = tmp_path / "audit.toml"
    path.write_text(tomli_w.dumps(spec))
    code, _, err = cli(capsys, "run", path, "--out", tmp_path / "audit", "--quiet", "--no-figures")
    assert one_line_error(code, err) and "no trace of 4 began" in err, err
