"""Small specs and a run helper shared by tests (imported as ``support_runs``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd

from biaslab.experiments.plan import make_plan
from biaslab.experiments.runner import run_plan
from biaslab.experiments.spec import spec_from_dict
from biaslab.traces.store import RunStore


def amplification_spec(**overrides) -> dict:
    """A small amplification spec on the synthetic scripted agent."""
    spec = {"name": "t", "protocol": "amplification",
            "models": ["scripted:amplification-synthetic"],
            "run": {"seeds": [42], "concurrency": 4, "retry_base_s": 0.0},
            "conditions": {"directions": ["pro_female", "pro_male"]},
            "options": {"datasets": ["math"], "max_test": 20, "n_resamples": 500}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def run_spec(spec: dict, run_dir, **kwargs):
    """Plan and run a spec dict; returns the RunResult."""
    plan = make_plan(spec_from_dict(spec))
    return asyncio.run(run_plan(plan, run_dir, progress=False, **kwargs))


def _calls(store: RunStore) -> pd.DataFrame:
    """What each call asked and got; not which call was a cache hit, nor timings."""
    frame = store.calls()[["cell_id", "node", "item", "sample", "attempt", "messages", "raw",
                           "parsed", "parse_error", "error", "exposed", "prompt_hash"]]
    return frame.map(repr).sort_values(["cell_id", "node", "item", "sample", "attempt"]
                                       ).reset_index(drop=True)


def _tables(run_dir: Path) -> dict[str, bytes]:
    """Every table's bytes. (Which of two identical calls paid and which was a cache hit
    depends on scheduling; that split lives in cache_use.csv, outside tables/.)"""
    return {path.relative_to(run_dir).as_posix(): path.read_bytes()
            for path in sorted((run_dir / "tables").rglob("*.csv"))}


def assert_same_run(run_dir: Path, reference: Path, *, all_done: bool = True,
                    reported: bool = True) -> None:
    """Two runs of one experiment hold the same cells, outputs, calls and tables."""
    a, b = RunStore(run_dir, readonly=True), RunStore(reference, readonly=True)
    try:
        assert a.meta()["fingerprint"] == b.meta()["fingerprint"]
        assert "shard" not in a.meta()
        cols = ["cell_id", "ord", "status", "error", "variant", "item", "target", "direction",
                "model", "seed"]
        pd.testing.assert_frame_equal(a.cells()[cols], b.cells()[cols])
        if all_done:
            assert set(a.cells()["status"]) == {"done"}
        assert a.raw_outputs() == b.raw_outputs() and len(b.raw_outputs()) > 0
        pd.testing.assert_frame_equal(_calls(a), _calls(b))
        assert len(a.cache) == len(b.cache)
    finally:
        a.close()
        b.close()
    tables = _tables(reference)
    assert _tables(run_dir) == tables and (tables or not reported)


AUGMENTATION_GENERATORS = ("abstraction", "transform", "scenario", "rephrase", "validator_1",
                           "validator_2", "validator_3")


def bound_nodes(model: str, nodes=(*AUGMENTATION_GENERATORS, "judge")) -> str:
    """``[nodes.<name>] model = ...`` tables binding each of `nodes` to one model."""
    return "".join(f'[nodes.{node}]\nmodel = "{model}"\n' for node in nodes)


def run_and_report_once(root: Path, spec_text: str) -> Path:
    """Run a spec through the CLI into ``root/run`` and report it, with a cache of its own
    under `root` (for module-scoped fixtures, which run before the per-test cache fixture)."""
    import pytest

    from biaslab.cli import main

    spec = root / "spec.toml"
    spec.write_text(spec_text)
    out = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report"]) == 0
        assert main(["report", str(out)]) == 0
    return out


def cli(*args) -> int:
    """``biaslab`` with these arguments, in this process; its exit code."""
    from biaslab.cli import main

    return main([str(a) for a in args])


def table(run: Path, name: str) -> pd.DataFrame:
    """A generic table of a run (``tables/<name>.csv``) with its text columns kept as text,
    blanks as ""."""
    text = {"stratum": str, "attribute": str, "group": str, "note": str}
    return pd.read_csv(run / "tables" / f"{name}.csv", dtype=text).fillna(
        {k: "" for k in text})


COUNT_FITS = """
import sys
from biaslab.datasets import student
fits = []
real = student.fit_ml_predictor
def counting(split):
    fits.append(split.seed)
    return real(split)
student.fit_ml_predictor = counting
from biaslab.cli import main
code = main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet", *sys.argv[3:]])
print("FITS", sorted(fits))
sys.exit(code)
"""
"""A fresh `biaslab run SPEC OUT [ARGS...]` process (``python -c COUNT_FITS ...``) that prints
the split seed of every model fit it made: ``FITS [42, 43]``."""
