"""Fitted models on disk beside the shared response cache (biaslab.datasets.fit_cache).

Each `biaslab run` below is its own process, as a user's would be: the in-process caches of
one cannot hide what the next one fits. A counting wrapper records each model fit."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading
import zipfile

import pytest
import skops.io as sio

from biaslab.datasets import fit_cache, student

from support_runs import COUNT_FITS

SPEC = """
name = "fits"
protocol = "amplification"
models = ["scripted:amplification-synthetic"]
[run]
seeds = [42, 43]
concurrency = 8
[options]
pipelines = ["E2"]
max_test = 20
n_resamples = 100
[conditions]
directions = ["pro_female"]
targets = "singletons"
"""



def _run(tmp_path, name: str, cache: str, *extra: str):
    """One `biaslab run` in a new process; (fits it made, stderr, its tables' bytes)."""
    spec = tmp_path / "fits.toml"
    spec.write_text(SPEC)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-c", COUNT_FITS, str(spec), str(out), *extra],
                          capture_output=True, text=True, timeout=600,
                          env={"BIASLAB_CACHE": cache, "HOME": str(home),
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    fits = next(line for line in proc.stdout.splitlines() if line.startswith("FITS"))
    tables = {p.relative_to(out).as_posix(): p.read_bytes()
              for p in sorted((out / "tables").rglob("*.csv"))}
    assert "tables/ml_anchor.csv" in tables  # the report read the fitted models too
    return fits, proc.stderr, tables


def test_a_second_process_fits_nothing_and_damage_is_refit(tmp_path):
    cache = tmp_path / "cache" / "calls.sqlite"
    fits_dir = cache.parent / "fits"
    first, err, tables = _run(tmp_path, "a", str(cache))
    assert first == "FITS [42, 43]" and "warning" not in err
    entries = sorted(fits_dir.glob("*.skops"))
    # per split: the fitted model, and its probabilities on that split's test rows
    assert len(entries) == 4, entries
    assert not list(fits_dir.glob("*.tmp"))  # written atomically: no temporary left behind

    second, err, again = _run(tmp_path, "b", str(cache))
    assert second == "FITS []" and "warning" not in err
    assert again == tables

    for entry in entries:  # truncated mid-write by a crash, say
        entry.write_bytes(entry.read_bytes()[:100])
    third, err, repaired = _run(tmp_path, "c", str(cache))
    assert third == "FITS [42, 43]"
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 4, err  # one per damaged entry, each naming it
    assert sorted(str(e) for e in entries) == sorted(
        next(str(e) for e in entries if str(e) in line) for line in warnings)
    assert all("fitting it again" in line for line in warnings)
    assert repaired == tables
    for entry in entries:  # rewritten whole, under the same names, in a format without code
        assert zipfile.is_zipfile(entry)
        assert isinstance(sio.loads(entry.read_bytes(), trusted=["sklearn.tree._tree.Tree"]),
                          dict)


class _RunsCode:
    """A pickle that, when loaded, leaves a file behind: what an entry written by someone
    else could do to whoever loads it, if entries were pickles."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_hostile_entries_run_no_code_and_are_refit(tmp_path):
    """Entries someone else wrote into the shared fits/ directory: a pickle that runs code, a
    skops file naming a function or a class biaslab never writes, a tree whose nodes point out
    of it. None is loaded or run; each is fitted again with one warning on its own line."""
    cache = tmp_path / "cache" / "calls.sqlite"
    fits_dir = cache.parent / "fits"
    _, _, tables = _run(tmp_path, "a", str(cache))
    models = sorted(p for p in fits_dir.glob("student-ml-[0-9a-f]*.skops"))
    probabilities = sorted(fits_dir.glob("student-ml-test-p-*.skops"))
    assert len(models) == len(probabilities) == 2
    marker = tmp_path / "code-ran"
    models[0].write_bytes(pickle.dumps({"key": "x", "value": _RunsCode(marker)}))
    payload = sio.loads(models[1].read_bytes(), trusted=["sklearn.tree._tree.Tree"])
    tree = payload["value"].named_steps["gbc"].estimators_[0, 0].tree_
    state = tree.__getstate__()
    inner = state["nodes"]["left_child"] != -1
    state["nodes"]["left_child"][inner.nonzero()[0][0]] = 10**6  # past the end of the tree
    tree.__setstate__(state)
    models[1].write_bytes(sio.dumps(payload))
    from sklearn.linear_model import LogisticRegression
    probabilities[0].write_bytes(sio.dumps({"key": "x", "value": LogisticRegression()}))
    probabilities[1].write_bytes(sio.dumps({"key": "x", "value": os.system}))

    fits, err, again = _run(tmp_path, "b", str(cache))
    assert not marker.exists()  # the pickle was never unpickled
    assert fits == "FITS [42, 43]" and again == tables
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 4, err
    assert all(line.startswith("biaslab: warning: the fitted model ") for line in warnings)
    by_entry = {entry: [line for line in warnings if str(entry) in line]
                for entry in (*models, *probabilities)}
    assert all(len(lines) == 1 for lines in by_entry.values()), by_entry
    assert "cannot be read back" in by_entry[models[0]][0]
    assert "is not the fit it is named for" in by_entry[models[1]][0]
    assert "LogisticRegression" in by_entry[probabilities[0]][0]
    assert "system" in by_entry[probabilities[1]][0]
    assert all("refusing to load it" in by_entry[p][0] for p in probabilities)
    assert all(zipfile.is_zipfile(entry) for entry in (*models, *probabilities))  # replaced


WARN_FROM_THREADS = textwrap.dedent("""
    import threading
    from biaslab.datasets import fit_cache
    start = threading.Barrier(8)
    def warn(n):
        start.wait()
        for i in range(200):
            fit_cache.warn_line(f"thread {n} entry {i} " + "x" * 200)
    threads = [threading.Thread(target=warn, args=(n,)) for n in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
""")


def test_warnings_from_parallel_threads_keep_one_line_each(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WARN_FROM_THREADS], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 8 * 200
    expected = {f"biaslab: warning: thread {n} entry {i} " + "x" * 200
                for n in range(8) for i in range(200)}
    assert set(lines) == expected


def test_cache_off_and_no_cache_keep_no_fits_on_disk(tmp_path):
    first, _, tables = _run(tmp_path, "a", "off")
    assert first == "FITS [42, 43]"
    cache = tmp_path / "cache" / "calls.sqlite"
    second, _, again = _run(tmp_path, "b", str(cache), "--no-cache")
    assert second == "FITS [42, 43]"
    assert again == tables
    # no fits/ beside the cache, and nothing under $HOME/.cache/biaslab but the user's
    # verdict key (traces.verdict_key: kept even with the cache off, so that two runs of one
    # spec render the same judge prompts)
    kept = [p for p in tmp_path.rglob("*") if p.name == "fits" or p.suffix == ".skops"
            or ("biaslab" in p.relative_to(tmp_path).parts and p.is_file()
                and p.name != "verdict-key")]
    assert kept == [], kept


# -- the key and the entry, in this process --------------------------------------------------
def _inputs(seed: int, table=None) -> dict:
    table = student.load_student("math") if table is None else table
    split = student.split_student(table, dataset="math", seed=seed, max_test=20)
    return student.fit_inputs(split, student.table_digest(table))


def test_the_key_follows_data_split_and_versions(tmp_path, monkeypatch):
    import sklearn

    def where(inputs):
        return fit_cache.entry_path(tmp_path, "student-ml", inputs)

    base = where(_inputs(42))
    assert where(_inputs(42)) == base  # a pure function of the inputs: stable
    assert where(_inputs(43)) != base  # another split
    changed = student.load_student("math")
    changed.loc[0, "absences"] += 1  # one value in the data file
    assert where(_inputs(42, changed)) != base
    monkeypatch.setattr(sklearn, "__version__", "0.0-other")
    assert where(_inputs(42)) != base  # another scikit-learn never unpickles this entry


def test_a_foreign_entry_is_refit_with_one_warning(tmp_path, capsys):
    inputs = {"x": 1}
    with fit_cache.fits_in(tmp_path):
        assert fit_cache.cached_fit("t", inputs, lambda: (1.5,)) == (1.5,)
        path = fit_cache.entry_path(tmp_path, "t", inputs)
        path.write_bytes(sio.dumps({"key": "someone else's", "value": (9.0,)}))
        calls = []
        value = fit_cache.cached_fit("t", inputs, lambda: calls.append(1) or (1.5,))
        assert value == (1.5,) and calls == [1]
        assert fit_cache.cached_fit("t", inputs, lambda: pytest.fail("refit")) == (1.5,)
    err = capsys.readouterr().err.splitlines()
    assert err == [f"biaslab: warning: the fitted model {path} is not the fit it is named for; "
                   "fitting it again"]


def test_an_unwritable_directory_warns_once_and_still_fits(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with fit_cache.fits_in(blocker / "fits"):
        assert [fit_cache.cached_fit("t", {"n": n}, lambda n=n: n) for n in range(3)] == [0, 1, 2]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "cannot keep fitted models in" in err[0], err


COUNT_PREDICTIONS = textwrap.dedent("""
    import sys
    from biaslab.datasets import student
    seen = []
    real = student.MLPredictor.predict_proba
    def counting(self, frame):
        seen.append(len(frame))
        return real(self, frame)
    student.MLPredictor.predict_proba = counting
    from biaslab.cli import main
    code = main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet", "--no-report"])
    print("PREDICTIONS", seen)
    sys.exit(code)
""")


def test_the_cells_of_a_split_share_one_prediction(tmp_path):
    """The 4 cells of a split (clean + 3 exposed agents) run at once; the ML probabilities
    are computed once per split, not once per cell that missed them at the same moment."""
    spec = tmp_path / "fits.toml"
    spec.write_text(SPEC)
    proc = subprocess.run([sys.executable, "-c", COUNT_PREDICTIONS, str(spec),
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=600,
                          env={"BIASLAB_CACHE": "off", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("PREDICTIONS"))
    assert line == "PREDICTIONS [20, 20]", line  # 2 splits, 20 test records each
