"""The command line: sample specs work, and bad input is one line with exit code 2."""

import json
from pathlib import Path

import pytest

from biaslab.cli import main

ROOT = Path(__file__).parents[1]
MATH = str(ROOT / "experiments" / "amplification_math.toml")


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_graph_prints_mermaid_for_each_pipeline(capsys):
    code, out, _ = run_cli(capsys, "graph", "amplification")
    assert code == 0 and out.count("graph TD;") == 3
    code, out, _ = run_cli(capsys, "graph", "amplification", "--variant", "E2")
    assert code == 0
    for edge in ("explanation --> prediction", "prediction --> ml", "ml -.-> judge",
                 "ml -.-> finalize", "judge --> finalize"):
        assert edge in out


def test_estimate_on_the_sample_specs(capsys):
    code, out, _ = run_cli(capsys, "estimate", MATH, "--scale", "paper", "--json")
    paper = json.loads(out)
    # 5 models x 3 seeds x (E0: 1+2, E1: 1+6, E2: 1+14) cells
    assert code == 0 and paper["cells"] == 5 * 3 * (3 + 7 + 15)
    assert paper["by_variant"]["E2"]["cells"] == 5 * 3 * 15
    code, out, _ = run_cli(capsys, "estimate", MATH, "--scale", "smoke", "--json")
    smoke = json.loads(out)
    assert code == 0 and 0 < smoke["calls_estimate"] < paper["calls_estimate"]
    assert smoke["cells"] == 3 + 7 + 9  # one model, one seed, each-and-all targets
    code, out, _ = run_cli(capsys, "estimate", MATH, "--json")  # every scale at once
    assert [r["scale"] for r in json.loads(out)] == ["paper", "smoke"]
    assert json.loads(out)[1] == smoke


def test_prompts_list_and_show(capsys):
    code, out, _ = run_cli(capsys, "prompts", "list")
    assert code == 0 and "amplification/judge" in out
    code, out, _ = run_cli(capsys, "prompts", "show", "amplification/judge")
    assert code == 0 and "FINAL: p" in out and "slots: record, explanation, p_llm, p_ml" in out


def write(tmp_path, text, name="spec.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


GOOD = 'name = "x"\nprotocol = "amplification"\nmodels = ["scripted:amplification-synthetic"]\n'


@pytest.mark.parametrize("spec, message", [
    ('name = "x"\nprotocol = "nope"', "unknown protocol 'nope'"),
    ('name = "x"\nprotocol = ', "is not valid TOML"),
    ('protocol = "amplification"', "name: Field required"),
    (GOOD + 'colour = "red"', "colour: Extra inputs are not permitted"),
    (GOOD + '[run]\nseeds = "42"', "run.seeds: Input should be a valid list"),
    (GOOD + '[nodes.critic]\nprompt = "x"', "has no LLM node 'critic'"),
    (GOOD + '[nodes.judge]\nprompt = "amplification/nope"', "unknown prompt 'amplification/nope'"),
    (GOOD + '[nodes.judge]\nprompt = "amplification/predict"',
     "declares slot 'records', but node 'judge'"),
    (GOOD + '[conditions]\ndirections = ["pro_robot"]', "unknown exposure direction 'pro_robot'"),
    (GOOD + '[conditions]\ntargets = ["predictor"]', "target 'predictor' names no LLM node"),
    (GOOD + '[options]\ndatasets = ["chem"]', "bad \\[options\\]"),
    (GOOD + '[options]\ndata_dir = "/nonexistent"', "student-mat.csv"),
    ('name = "x"\nprotocol = "amplification"\nmodels = ["gpt4"]', "unknown model 'gpt4'"),
    ('name = "x"\nprotocol = "amplification"\nmodels = ["local:/nonexistent/m.gguf"]',
     "/nonexistent/m.gguf"),
    ('name = "x"\nprotocol = "amplification"\nmodels = ["scripted:nope"]',
     "unknown scripted model 'nope'"),
    (GOOD.replace('models = ["scripted:amplification-synthetic"]',
                  'models = ["scripted:amplification-synthetic", "scripted:amplification-synthetic"]'),
     "names 'scripted:amplification-synthetic' twice"),
    (GOOD + '[model_aliases.m]\nprovider = "openai-compatible"\nmodel = "x"\n'
            'api_key = "sk-PASTED-SECRET"', "api_key: Extra inputs are not permitted.*api_key_env"),
    # the protocol of `biaslab import traces` runs only comes from an import
    ('name = "x"\nprotocol = "imported-traces"\nmodels = ["scripted:recorded-traffic"]\n'
     '[options]\nitems = ["a1"]\nnodes = ["reviewer"]',
     "protocol 'imported-traces' is not run from a spec: its runs are written by biaslab "
     "import traces"),
])
def test_bad_specs_are_one_line_errors(tmp_path, capsys, spec, message):
    code, out, err = run_cli(capsys, "run", write(tmp_path, spec), "--out", str(tmp_path / "o"))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("biaslab: error:")
    assert "sk-PASTED-SECRET" not in err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_missing_api_key_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    code, _, err = run_cli(capsys, "run", MATH, "--out", str(tmp_path / "o"))
    assert code == 2 and "OPENROUTER_API_KEY" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["run"], "the following arguments are required: spec"),
    (["frobnicate"], "invalid choice"),
    (["graph", "amplification", "--variant", "E9"], "no variant 'E9'"),
    (["run", MATH, "--concurrency", "0"], "--concurrency must be at least 1"),
    (["run", MATH, "--scale", "huge"], "no \\[scale.huge\\]"),
    (["replay", "/nonexistent", "--mode", "strict"], "not a run directory"),
    (["prompts", "show", "amplification/nope"], "unknown prompt"),
])
def test_bad_arguments_are_one_line_errors(capsys, args, message):
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and err.count("\n") == 1
    assert __import__("re").search(message, err), err


def test_run_report_replay_and_export_through_the_cli(tmp_path, capsys):
    spec = write(tmp_path, GOOD + '[run]\nseeds = [42]\n[conditions]\ndirections = ["pro_male"]\n'
                 'targets = "singletons"\n[options]\npipelines = ["E0", "E1"]\nmax_test = 10\n'
                 'n_resamples = 200\n')
    out_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "run", spec, "--out", str(out_dir), "--quiet")
    assert code == 0, err
    assert (out_dir / "tables" / "table1.md").is_file() and (out_dir / "spec.toml").is_file()
    assert "5 cells run" in err
    import pandas as pd
    anchor = pd.read_csv(out_dir / "tables" / "ml_anchor.csv")  # reported without E2 too
    from biaslab.datasets import fit_ml_predictor, load_student, split_student
    split = split_student(load_student("math"), dataset="math", seed=42, max_test=10)
    expected = fit_ml_predictor(split).evaluate(split)
    assert len(anchor) == 1 and anchor["accuracy"].iloc[0] == pytest.approx(expected["accuracy"])
    code, _, err = run_cli(capsys, "run", spec, "--out", str(out_dir))
    assert code == 2 and "--resume" in err
    code, out, _ = run_cli(capsys, "replay", str(out_dir), "--mode", "strict", "--quiet")
    assert code == 0 and "outputs identical, 0 model calls" in out
    code, out, _ = run_cli(capsys, "replay", str(out_dir), "--mode", "rescore")
    assert code == 0 and "table1.csv" in out
    from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
    register_scripted("cli-judge", lambda: ScriptedChatModel(rules=[
        Rule("favouritism", '{"label": "neutral", "justification": "plain summary"}')]))
    code, out, err = run_cli(capsys, "replay", str(out_dir), "--mode", "rescore", "--judge-node",
                             "explanation", "--judges", "scripted:cli-judge", "--repeats", "2")
    assert code == 0, err
    # three E1 cells each recorded an explanation; the synthetic agent wrote the same text each
    # time, so the 3 x 2 verdicts need only 2 judge calls
    assert "judged 3 recorded 'explanation' answers with 1 judge(s) x 2: 2 judge calls" in out
    assert (out_dir / "evals" / "judge" / "scores.csv").is_file()
    code, _, err = run_cli(capsys, "replay", str(out_dir), "--mode", "rescore", "--judge-node",
                           "explanation")
    assert code == 2 and "--judges" in err
    code, out, _ = run_cli(capsys, "export", str(out_dir), "--format", "jsonl")
    assert code == 0 and (out_dir / "export" / "calls.jsonl").is_file()
    code, out, _ = run_cli(capsys, "export", str(out_dir))
    import pandas as pd
    calls = pd.read_parquet(out_dir / "export" / "calls.parquet")
    assert len(calls) > 0 and {"node", "prompt_hash", "cache_key", "raw"} <= set(calls.columns)


def test_spec_paths_are_relative_to_the_spec_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "judge.toml").write_text(
        'slots = ["record", "p_llm", "p_ml"]\nuser = "Student: $record\\n$p_llm $p_ml FINAL: p"')
    spec = write(tmp_path, GOOD + '[nodes.judge]\nprompt = "p/judge.toml"\n[options]\n'
                 'pipelines = ["E2"]\nmax_test = 10\nn_resamples = 200\n[conditions]\n'
                 'targets = ["judge"]\ndirections = ["pro_male"]\n')
    monkeypatch.chdir("/")
    code, _, err = run_cli(capsys, "run", spec, "--out", str(tmp_path / "o"), "--quiet")
    assert code == 0, err
    assert str(tmp_path / "p" / "judge.toml") in (tmp_path / "o" / "spec.toml").read_text()


# -- defects found when tried as a new user would ----------------------------------------------
SMALL = (GOOD + '[run]\nseeds = [42]\nretry_base_s = 0.0\n[conditions]\ndirections = ["pro_male"]\n'
         'targets = "singletons"\n[options]\npipelines = ["E0"]\nmax_test = 10\nn_resamples = 200\n')


def one_line(code, err):
    """Exit 2, and the error is one line (after at most the run's own banner line)."""
    lines = err.splitlines()
    return (code == 2 and "Traceback" not in err and len(lines) <= 2
            and [line for line in lines if line.startswith("biaslab: error:")] == lines[-1:])


def test_an_unusable_out_is_one_line(tmp_path, capsys):
    spec = write(tmp_path, SMALL)
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile" / "run", Path("/proc/biaslab-run")):
        code, _, err = run_cli(capsys, "run", spec, "--out", str(out), "--quiet")
        assert one_line(code, err) and "cannot use" in err and str(out) in err, err


def test_a_corrupted_store_is_one_line_for_every_verb(tmp_path, capsys):
    spec = write(tmp_path, SMALL)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", spec, "--out", str(out), "--quiet", "--no-report")
    assert code == 0, err
    (out / "run.sqlite").write_bytes(b"this is not a database" * 100)
    for name in ("run.sqlite-wal", "run.sqlite-shm"):
        (out / name).unlink(missing_ok=True)
    for args in (["report", out], ["replay", out, "--mode", "rescore"],
                 ["replay", out, "--mode", "strict", "--out", tmp_path / "s"],
                 ["replay", out, "--mode", "counterfactual", "--targets", "all", "--out",
                  tmp_path / "c"],
                 ["export", out], ["run", "--resume", out], ["run", spec, "--out", out,
                                                             "--resume"]):
        code, _, err = run_cli(capsys, *map(str, args))
        assert one_line(code, err) and "not a readable biaslab run store" in err, (args, err)
    assert not (tmp_path / "s").exists() and not (tmp_path / "c").exists()


def test_broken_pipe_exits_quietly(monkeypatch, capsys):
    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", Closed())
    assert main(["graph", "amplification"]) == 141
    monkeypatch.undo()
    assert capsys.readouterr().err == ""


def test_broken_pipe_through_a_real_pipe_has_no_traceback():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "biaslab", "graph", "amplification"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # the reader is gone before the first line is written (like `| head`)
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141


def test_resume_from_the_run_directory_alone(tmp_path, capsys):
    """The hint printed after a failure is a command that works as printed."""
    from biaslab.agents.providers.scripted import Fault, register_scripted
    from biaslab.graphs.amplification_synthetic import make_agent

    once = Fault("400", times=1, match="OUTPUT: \\[p1")

    def flaky():
        agent = make_agent()
        agent.faults = [once]
        return agent

    register_scripted("cli-flaky", flaky)
    spec = write(tmp_path, SMALL.replace('targets = "singletons"', 'targets = "all"') +
                 '[scale.tiny.options]\nmax_test = 6\n')
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", spec, "--scale", "tiny", "--model", "scripted:cli-flaky",
                           "--out", str(out), "--quiet")
    assert code == 1 and "failed" in err
    hint = next(line for line in err.splitlines() if "fix the cause, then:" in line)
    command = hint.split("then: ", 1)[1].split()
    assert command == ["biaslab", "run", "--resume", str(out)]
    code, _, err = run_cli(capsys, *command[1:], "--quiet")
    assert code == 0, err
    assert "1 cells run, 1 already done, 0 failed" in err
    import pandas as pd
    predictions = pd.read_csv(out / "tables" / "predictions.csv")
    assert len(predictions) == 2 * 6 and set(predictions["model"]) == {"scripted:cli-flaky"}
    for args, message in ((["run", str(out)], "biaslab run --resume"),
                          (["run", "--resume", str(out), "--scale", "paper"], "--scale cannot"),
                          (["run", "--resume", str(out), "--out", str(tmp_path / "x")],
                           "continues in its own directory")):
        code, _, err = run_cli(capsys, *args)
        assert one_line(code, err) and message in err, err


def test_report_on_a_run_in_progress_says_so(tmp_path, capsys):
    import fcntl
    import sqlite3

    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", write(tmp_path, SMALL), "--out", str(out), "--quiet")
    assert code == 0, err
    conn = sqlite3.connect(out / "run.sqlite")
    conn.execute("UPDATE cells SET status='running' WHERE cell_id NOT LIKE '%/none/%'")
    conn.commit()
    conn.close()
    with open(out / ".lock", "w") as held:  # what a live `biaslab run` holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = run_cli(capsys, "report", str(out))
        assert one_line(code, err), err
        assert "still in progress (1 cells done, 1 running)" in err
    code, out_text, err = run_cli(capsys, "report", str(out))  # the writer has gone: reported
    assert code == 0, err


def test_a_shadowed_prompt_records_its_file(tmp_path, capsys):
    shadow = tmp_path / "mine" / "amplification"
    shadow.mkdir(parents=True)
    own = shadow / "predict.toml"
    own.write_text('slots = ["records", "n"]\nuser = "Rows ($n):\\n$records\\n'
                   'Failure probability of each, one line: OUTPUT: [p1 p2 ...]"\n')
    spec = write(tmp_path, 'prompt_overrides = ["mine"]\n' + SMALL)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", spec, "--out", str(out), "--quiet", "--no-report")
    assert code == 0, err
    from biaslab.traces.store import RunStore
    calls = RunStore(out, readonly=True).calls()
    assert set(calls["prompt_source"]) == {str(own.resolve())}
    code, _, err = run_cli(capsys, "run", write(tmp_path, SMALL, "plain.toml"), "--out",
                           str(tmp_path / "plain"), "--quiet", "--no-report")
    calls = RunStore(tmp_path / "plain", readonly=True).calls()
    assert set(calls["prompt_source"]) == {"biaslab:amplification/predict.toml"}
