"""Fitted models on disk beside the shared response cache (biaslab.datasets.fit_cache).

Each `biaslab run` below is its own process, as a user's would be: the in-process caches of
one cannot hide what the next one fits. A counting wrapper records each model fit."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest

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
    entries = sorted(fits_dir.glob("*.pkl"))
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
    for entry in entries:  # rewritten whole, under the same names
        assert isinstance(pickle.loads(entry.read_bytes()), dict)


def test_cache_off_and_no_cache_keep_no_fits_on_disk(tmp_path):
    first, _, tables = _run(tmp_path, "a", "off")
    assert first == "FITS [42, 43]"
    cache = tmp_path / "cache" / "calls.sqlite"
    second, _, again = _run(tmp_path, "b", str(cache), "--no-cache")
    assert second == "FITS [42, 43]"
    assert again == tables
    kept = [p for p in tmp_path.rglob("*") if p.name == "fits" or p.suffix == ".pkl"
            or "biaslab" in p.relative_to(tmp_path).parts]
    assert kept == [], kept  # no fits/ beside the cache, nothing under $HOME/.cache/biaslab


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
        path.write_bytes(pickle.dumps({"key": "someone else's", "value": (9.0,)}))
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
