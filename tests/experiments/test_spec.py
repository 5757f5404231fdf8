"""Spec mistakes a new user makes: each is one line, exit code 2, and nothing is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from biaslab.cli import main

GOOD = ('name = "x"\nprotocol = "amplification"\nmodels = ["scripted:amplification-synthetic"]\n')


def plugin(build: str, *, top: str = "") -> str:
    """A protocol file of the user's own whose ``build()`` body is `build`."""
    return (f"{top}from typing import TypedDict\n"
            "from langgraph.graph import END, START, StateGraph\n"
            "from biaslab.agents.context import CellContext\n"
            "from biaslab.graphs import Protocol, protocol\n\n"
            "class State(TypedDict, total=False):\n    item: str\n    out: str\n\n"
            "def answer(state):\n    return {'out': 'x'}\n\n"
            "@protocol\nclass Mine(Protocol):\n    name = 'mine'\n\n"
            "    def items(self, options):\n        return ['one']\n\n"
            "    def build(self, variant, options=None):\n"
            "        b = StateGraph(State, context_schema=CellContext)\n"
            "        b.add_node('answer', answer)\n"
            f"        {build}\n")


APP = ('name = "x"\napp = "app.py:build"\nitems = "cases.jsonl"\n'
       'models = ["scripted:amplification-synthetic"]\n[outcome]\nfield = "decision"\n')
MINE = 'name = "x"\nprotocol = "mine"\nplugins = ["mine.py"]\nmodels = ["scripted:amplification-synthetic"]\n'
STUDENT = (Path(__file__).parents[2] / "biaslab" / "datasets" / "files" / "student"
           / "student-mat.csv")


def run(tmp_path: Path, capsys, text: str, *extra: str):
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    code = main(["run", str(spec), *extra])
    out, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize("text, message", [
    (GOOD + "[run]\nseeds = [-1]\n", r"run\.seeds\.0: Input should be greater than or equal to 0"),
    (GOOD + "[run]\nseeds = [4294967296]\n", r"run\.seeds\.0: .*less than or equal to 4294967295"),
    (GOOD + "[run]\nseeds = [42, 43, 42]\n", r"seed 42 is listed twice"),
    (GOOD + "[conditions]\ndirections = []\n", r"conditions\.directions: is empty"),
    (GOOD + "[options]\nn_resamples = 1000000000000\n", r"n_resamples.*1000000"),
    ("a = " + "[" * 3000 + "]" * 3000 + "\n", r"nested too deeply"),
    (GOOD.replace('"x"', '"../escape"'), r"name: must be letters, digits"),
    (GOOD.replace('"x"', '"/tmp/abs"'), r"name: must be letters, digits"),
    # A case may bring files, written beside the spec: (spec text, {path: text, or None for
    # a directory}). A spec with plugins is also drawn with `biaslab graph`, which must fail
    # the same way.
    ((MINE, {"mine.py": plugin("b.add_edge(START, 'answer'); b.add_edge('answer', 'nowhere')"
                               "; return b")}),
     r"protocol 'mine' build\('default'\): the graph is not valid: .*unknown node `nowhere`"),
    ((MINE, {"mine.py": plugin("b.add_edge('answer', END); return b")}),
     r"build\('default'\): the graph is not valid: Graph must have an entrypoint"),
    ((MINE, {"mine.py": plugin("raise RuntimeError('no graph today')")}),
     r"protocol 'mine' build\('default'\) raised RuntimeError: no graph today"),
    ((MINE, {"mine.py": plugin("return None")}),
     r"build\('default'\) returned NoneType, not a langgraph StateGraph"),
    ((MINE, {"mine.py": plugin("return b", top="import sys\nsys.exit(0)\n")}),
     r"plugin .*mine\.py called sys\.exit\(0\); a plugin must not exit"),
    (GOOD + "[options]\npipelines = []\n", r"protocol 'amplification' has no variant to run"),
    (GOOD + "[options]\ndatasets = []\n", r"has no items to run .*the grid has 0 cells"),
    (GOOD + "[run]\nseeds = [true]\n", r"run\.seeds\.0: Input should be a valid integer"),
    (GOOD + '[options]\ndata_dir = "data\\u0000x"\n',
     r"options\.data_dir: holds a NUL character"),
    ('name = "x"\nprotocol = "amplification"\nmodels = ["m"]\n[model_aliases.m]\n'
     'provider = "openai-compatible"\nmodel = "x"\nbase_url = "http://[::1/v1"\n',
     r"model table m: base_url: .*not a valid URL \(Invalid IPv6 URL\)"),
    ((GOOD + '[options]\ndatasets = ["math"]\ndata_dir = "data"\n',
      {"data/student-mat.csv": "".join(STUDENT.read_text().splitlines(True)[:4])}),
     r"the math data \(3 rows, 2 failing\) is too small for a 80%/20% split"),
    (('prompt_overrides = ["mine"]\n' + GOOD, {"mine/amplification/predict.toml": None}),
     r"prompt override .*predict\.toml is a directory, not a template file"),
    # issue 47: the last silent accepts of a spec
    (APP + '[directions.pro_a]\nfavored = ""\nother = "group b"\n',
     r"\[directions\.pro_a\]: favored is empty"),
    (APP + '[directions.pro_a]\nfavored = "group b"\nother = "Group B"\n',
     r"\[directions\.pro_a\]: favored and other are both 'group b'"),
    (GOOD + '[model_aliases.openrouter]\nprovider = "scripted"\nmodel = "x"\n',
     r"model_aliases\.openrouter: the name shadows the provider 'openrouter'"),
    (GOOD.replace('models = ["scripted:amplification-synthetic"]', 'models = ["local"]')
     + '[model_aliases.local]\nprovider = "scripted"\nmodel = "amplification-synthetic"\n',
     r"model_aliases\.local: the name shadows the provider 'local'"),
])
def test_bad_values_are_one_line(tmp_path, capsys, monkeypatch, text, message):
    text, files = text if isinstance(text, tuple) else (text, {})
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).mkdir() if content is None else (tmp_path / name).write_text(content)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    code, err = run(tmp_path, capsys, text)
    assert code == 2 and err.count("\n") == 1 and err.startswith("biaslab: error:"), err
    assert "Traceback" not in err
    assert re.search(message, err), err
    if "plugins" in text:
        code = main(["graph", str(tmp_path / "spec.toml")])
        out, graph_err = capsys.readouterr()
        assert code == 2 and graph_err.count("\n") == 1 and re.search(message, graph_err)
    tops = {Path(name).parts[0] for name in files}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"spec.toml", "work", *tops})
    assert not any((tmp_path / "work").iterdir())  # no runs/ written anywhere


def test_a_name_cannot_leave_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run(tmp_path, capsys, GOOD.replace('"x"', '"a..b"') +
                    '[options]\npipelines = ["E0"]\nmax_test = 10\nn_resamples = 200\n'
                    '[conditions]\ndirections = ["pro_male"]\n', "--quiet", "--no-report")
    assert code == 0, err  # dots inside a name are fine: it stays one directory under runs/
    assert (tmp_path / "runs" / "a..b-paper" / "run.sqlite").is_file()


def test_a_prompt_override_that_is_a_directory_is_named(tmp_path, capsys):
    (tmp_path / "mine" / "amplification").mkdir(parents=True)
    code, err = run(tmp_path, capsys, GOOD + '[nodes.prediction]\nprompt = "mine"\n',
                    "--out", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1, err
    assert "[nodes.prediction] prompt: mine is a directory" in err and "prompt_overrides" in err
    (tmp_path / "file.toml").write_text('slots = []\nuser = "hi"\n')
    code, err = run(tmp_path, capsys, 'prompt_overrides = ["file.toml"]\n' + GOOD,
                    "--out", str(tmp_path / "o"))
    assert code == 2 and "prompt_overrides:" in err and "is a file" in err, err
    assert not (tmp_path / "o").exists()


def test_protocol_default_exposure_template_and_spec_relative_option_paths(tmp_path):
    """A roleplay spec that names no exposure template gets roleplay's own (its directions fill
    a 'stance' slot that the generic template lacks); a labels path is relative to the spec."""
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import load_spec

    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "human.csv").write_text("qid,sample,label\n")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text('name = "x"\nprotocol = "roleplay"\nmodels = ["scripted:roleplay-synthetic"]\n'
                         '[options]\nattributes = ["age"]\nper_stratum = 1\n'
                         'human_labels = "labels/human.csv"\n')
    spec = load_spec(spec_path)
    assert spec.options["human_labels"] == str(tmp_path / "labels" / "human.csv")
    plan = make_plan(spec)
    assert plan.exposure_template == "roleplay/exposure"
    exposed = [c for conds in plan.conditions.values() for c in conds if c.exposures]
    assert exposed and all(e.template == "roleplay/exposure" for c in exposed for e in c.exposures)


# -- bad arguments and refused resumes: the same rule through every verb ---------------------
ARG_SPEC = GOOD + ('[run]\nseeds = [42]\n[options]\npipelines = ["E0"]\ndatasets = ["math"]\n'
                   'max_test = 10\nn_resamples = 100\n[conditions]\ndirections = ["pro_male"]\n'
                   'targets = "singletons"\n')


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished run without a report, made once; each case copies it."""
    root = tmp_path_factory.mktemp("finished")
    (root / "spec.toml").write_text(ARG_SPEC)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", "off")
        assert main(["run", str(root / "spec.toml"), "--out", str(root / "run"), "--quiet",
                     "--no-report"]) == 0
    return root


def _no_spec(run):
    (run / "spec.toml").unlink()  # as if killed after the store was made, before the spec


def _no_store(run):
    for path in run.glob("run.sqlite*"):
        path.unlink()


def _empty_store(run):
    _no_store(run)
    (run / "run.sqlite").write_bytes(b"")


# (argv with SPEC, RUN for the copied spec and run, what to do to the run first, message)
@pytest.mark.parametrize("argv, damage, message", [
    ("export RUN --out SPEC", None, r"cannot use --out .*spec\.toml: it is a file, and this "
                                    r"command writes a directory"),
    # issue 47: one rule for every verb's --out, and the last silent accepts
    ("replay RUN --mode rescore --sensitivity --out SPEC", None, r"spec\.toml: it is a file"),
    ("replay RUN --mode rescore --sensitivity --out SPEC/x", None,
     r"cannot use --out .*spec\.toml/x: .*spec\.toml is a file, not a directory"),
    ("replay RUN --mode rescore --out RUN/tables/x", None,
     r"cannot use --out .*run/tables/x: it is inside the source run"),
    ("replay RUN --mode rescore --sensitivity --out RUN", None, r"inside the source run"),
    ("replay RUN --mode strict --out RUN/again", None, r"inside the source run"),
    ("merge RUN --out RUN/merged", None, r"inside the source run"),
    ("run SPEC --out NEW\nx", None, r"cannot use --out '.*new\\nx': its name holds a control "
                                    r"character \('\\n'\)"),
    ("export RUN --out NEW\tx", None, r"holds a control character"),
    ("run SPEC --shard 1/2", None, r"--shard needs --out"),
    ("run SPEC --shard 1/2 --resume --out NEW", None,
     r"--resume: .*new holds no run of shard 1/2 to continue"),
    ("replay RUN --mode rescore --sensitivity --judges scripted:no-such-judge", None,
     r"--judges scripted:no-such-judge: unknown scripted model 'no-such-judge'"),
    ("replay RUN --mode rescore --sensitivity --judges judge", None,
     r"--judges: 'judge' is the name of a judge node"),
    ("estimate SPEC --mde 2", None, r"--mde 2\.0: FBS on math test records is bounded"),
    ("run SPEC --out ", None, r"--out is empty"),
    ("run SPEC --model  --out NEW", None, r"--model is empty"),
    ("run SPEC --scale  --out NEW", None, r"--scale is empty"),
    ("run SPEC --out NEW --ray-address 127.0.0.1:6379", None,
     r"--ray-address goes with --executor ray"),
    ("replay RUN --mode strict --node prediction --out NEW", None,
     r"--node goes with --mode counterfactual; --mode strict would ignore it"),
    ("replay RUN --mode rescore --repeats 0", None, r"--repeats must be at least 1, got 0"),
    ("replay RUN --mode rescore --repeats 2", None, r"--repeats goes with .*--judge-node"),
    ("replay RUN --mode rescore --labels X", None, r"--labels goes with .*--judge-node"),
    ("estimate SPEC --pilot NEW", None, r"--pilot goes with --power \(or --mde\)"),
    ("merge RUN RUN --out NEW", None, r"run is listed twice"),
    ("replay RUN --mode rescore --sensitivity", None, r"holds no calls of the judge nodes"),
    ("run SPEC --out RUN --resume", _no_store, r"run\.sqlite is missing, though .* held a run"),
    ("run SPEC --out RUN --resume", _empty_store, r"run\.sqlite is empty, though .* held a run"),
    ("run --resume RUN", _no_store, r"is not a run directory \(no run\.sqlite\)"),
    ("run --resume RUN", _no_spec, r"no spec\.toml .* biaslab run SPEC\.toml --out .*run "
                                   r"--resume"),
])
def test_bad_arguments_are_one_line(finished_run, tmp_path, capsys, monkeypatch, argv, damage,
                                    message):
    import shutil

    monkeypatch.setenv("BIASLAB_CACHE", "off")
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    shutil.copy(finished_run / "spec.toml", tmp_path / "spec.toml")
    if damage:
        damage(run)
    def files():  # every file and folder, but SQLite's own -shm/-wal of a read-only open
        return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")
                if p.is_file() and not p.name.endswith(("-shm", "-wal"))} | {
                p: None for p in tmp_path.rglob("*") if p.is_dir()}

    before = files()
    words = argv.replace("SPEC", str(tmp_path / "spec.toml")).replace(
        "RUN", str(run)).replace("NEW", str(tmp_path / "new")).split(" ")
    code = main(words)
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and err.startswith("biaslab: error:"), err
    assert re.search(message, err), err
    assert files() == before  # nothing written, created or touched


@pytest.mark.parametrize("table", ['[run]\nretry_base_s = inf\n',
                                   '[model_aliases.m]\nprovider = "scripted"\n'
                                   'model = "amplification-synthetic"\ntimeout_s = inf\n',
                                   '[model_aliases.m]\nprovider = "scripted"\n'
                                   'model = "amplification-synthetic"\nrps = nan\n'])
def test_infinite_and_nan_settings_are_one_line(tmp_path, capsys, monkeypatch, table):
    monkeypatch.chdir(tmp_path)
    text = GOOD.replace('["scripted:amplification-synthetic"]', '["m"]') if "model_aliases" \
        in table else GOOD
    code, err = run(tmp_path, capsys, text + table, "--out", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1 and "Input should be a finite number" in err, err
    assert not (tmp_path / "o").exists()
