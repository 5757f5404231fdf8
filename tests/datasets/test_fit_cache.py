"""Fitted results on disk beside the shared response cache (biaslab.datasets.fit_cache).

Each `biaslab run` below is its own process, as a user's would be: the in-process caches of
one cannot hide what the next one fits. A counting wrapper records each model fit."""

from __future__ import annotations

import json
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
    # (figures off: they are not what is checked here, and drawing them was a third of a run)
    proc = subprocess.run([sys.executable, "-c", COUNT_FITS, str(spec), str(out),
                           "--no-figures", *extra],
                          capture_output=True, text=True, timeout=600,
                          env={"BIASLAB_CACHE": cache, "HOME": str(home),
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    fits = next(line for line in proc.stdout.splitlines() if line.startswith("FITS"))
    tables = {p.relative_to(out).as_posix(): p.read_bytes()
              for p in sorted((out / "tables").rglob("*.csv"))}
    assert "tables/ml_anchor.csv" in tables  # the report read the fitted models too
    return fits, proc.stderr, tables


def _entry(path) -> dict:
    """An entry as written: JSON holding the key it is named for and the split's P(fail)s."""
    payload = json.loads(path.read_text())
    assert set(payload) == {"key", "value"} and path.name[len("student-ml-test-p-"):-5] \
        == payload["key"][:40]
    assert len(payload["value"]) == 20 and all(type(p) is float for p in payload["value"])
    return payload


def test_a_second_process_fits_nothing_and_damage_is_refit(tmp_path):
    cache = tmp_path / "cache" / "calls.sqlite"
    fits_dir = cache.parent / "fits"
    first, err, tables = _run(tmp_path, "a", str(cache))
    assert first == "FITS [42, 43]" and "warning" not in err
    entries = sorted(fits_dir.iterdir())
    # per split: the model's probabilities on that split's test rows (the model itself is
    # fitted in memory: the next process needs its probabilities only); no temporary left
    # behind: written atomically
    assert [e.name[:18] for e in entries] == ["student-ml-test-p-"] * 2, entries
    written = [_entry(e) for e in entries]

    second, err, again = _run(tmp_path, "b", str(cache))
    assert second == "FITS []" and "warning" not in err  # the report's ML anchor read them too
    assert again == tables

    for entry in entries:  # truncated mid-write by a crash, say
        entry.write_bytes(entry.read_bytes()[:100])
    third, err, repaired = _run(tmp_path, "c", str(cache))
    assert third == "FITS [42, 43]"
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 2, err  # one per damaged entry, each naming it
    assert sorted(str(e) for e in entries) == sorted(
        next(str(e) for e in entries if str(e) in line) for line in warnings)
    assert all("cannot be read back" in line and "fitting it again" in line
               for line in warnings)
    assert repaired == tables
    assert [_entry(e) for e in entries] == written  # rewritten whole, under the same names


class _RunsCode:
    """A pickle that, when loaded, leaves a file behind: what an entry written by someone
    else could do to whoever loads it, if entries were pickles."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_hostile_entries_run_no_code_and_are_refit(tmp_path):
    """Entries someone else wrote into the shared fits/ directory: a pickle that runs code,
    and an entry under the right key whose probabilities are out of range. Neither is loaded
    or run; each is fitted again with one warning on its own line, and replaced."""
    cache = tmp_path / "cache" / "calls.sqlite"
    fits_dir = cache.parent / "fits"
    _, _, tables = _run(tmp_path, "a", str(cache))
    entries = sorted(fits_dir.glob("student-ml-test-p-*.json"))
    assert len(entries) == 2
    written = [_entry(e) for e in entries]
    marker = tmp_path / "code-ran"
    entries[0].write_bytes(pickle.dumps({"key": written[0]["key"], "value": _RunsCode(marker)}))
    forged = {"key": written[1]["key"], "value": [7.0] * 20}  # not probabilities
    entries[1].write_text(json.dumps(forged))

    fits, err, again = _run(tmp_path, "b", str(cache))
    assert not marker.exists()  # the pickle was never unpickled
    assert fits == "FITS [42, 43]" and again == tables
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 2, err
    assert all(line.startswith("biaslab: warning: the fitted result ") for line in warnings)
    by_entry = {entry: [line for line in warnings if str(entry) in line] for entry in entries}
    assert all(len(lines) == 1 for lines in by_entry.values()), by_entry
    assert "cannot be read back" in by_entry[entries[0]][0]
    assert "is not the fit it is named for" in by_entry[entries[1]][0]
    assert [_entry(e) for e in entries] == written  # replaced by the true fits


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
    kept = [p for p in tmp_path.rglob("*") if p.name == "fits"
            or p.name.startswith("student-ml")
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


@pytest.mark.parametrize("content", [
    json.dumps({"key": "someone else's", "value": [9.0]}).encode(),  # another fit's entry
    b"PK\x03\x04 a zip (a skops file of an earlier release)",
    json.dumps({"key": None, "value": {"__class__": "os.system"}}).encode(),
    json.dumps([1.5]).encode(),  # JSON, but not an entry
], ids=["another-key", "not-json", "an-object", "a-bare-value"])
def test_a_foreign_entry_is_refit_with_one_warning(tmp_path, capsys, content):
    inputs = {"x": 1}
    with fit_cache.fits_in(tmp_path):
        assert fit_cache.cached_fit("t", inputs, lambda: (1.5,), decode=tuple) == (1.5,)
        path = fit_cache.entry_path(tmp_path, "t", inputs)
        assert json.loads(path.read_text())["value"] == [1.5]
        path.write_bytes(content)
        calls = []
        value = fit_cache.cached_fit("t", inputs, lambda: calls.append(1) or (1.5,),
                                     decode=tuple)
        assert value == (1.5,) and calls == [1]
        assert fit_cache.cached_fit("t", inputs, lambda: pytest.fail("refit"),
                                    decode=tuple) == (1.5,)
    err = capsys.readouterr().err.splitlines()
    reason = ("cannot be read back" if content.startswith(b"PK")
              else "is not the fit it is named for")
    assert len(err) == 1 and err[0].startswith(f"biaslab: warning: the fitted result {path} "), err
    assert reason in err[0] and err[0].endswith("fitting it again"), err


def test_a_result_that_is_not_json_data_is_kept_in_memory_only(tmp_path, capsys):
    with fit_cache.fits_in(tmp_path):
        assert fit_cache.cached_fit("t", {"n": 1}, lambda: {1.5}) == {1.5}
        assert fit_cache.cached_fit("t", {"n": 2}, lambda: float("nan")) != 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is not JSON data" in err[0], err  # one warning per kind
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_directory_warns_once_and_still_fits(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with fit_cache.fits_in(blocker / "fits"):
        assert [fit_cache.cached_fit("t", {"n": n}, lambda n=n: n) for n in range(3)] == [0, 1, 2]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "cannot keep fitted results in" in err[0], err


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


def test_no_cache_in_python_keeps_no_fits_on_disk_for_the_report_either(tmp_path,
                                                                         isolated_cache):
    """``biaslab.run(..., no_cache=True)`` and a counterfactual with ``no_cache=True``: their
    reports read the ML probabilities too, and write none beside the cache either."""
    import biaslab

    spec = tmp_path / "fits.toml"
    spec.write_text(SPEC)
    run = biaslab.run(spec, out=tmp_path / "run", no_cache=True, quiet=True, no_figures=True)
    assert (tmp_path / "run" / "tables" / "ml_anchor.csv").is_file()
    run.counterfactual(tmp_path / "cf", directions=["pro_male"], no_cache=True, quiet=True)
    assert (tmp_path / "cf" / "tables" / "ml_anchor.csv").is_file()
    assert not (isolated_cache.parent / "fits").exists()
