"""Small specs and a run helper shared by tests (imported as ``support_runs``)."""

from __future__ import annotations

import asyncio

from biaslab.experiments.plan import make_plan
from biaslab.experiments.runner import run_plan
from biaslab.experiments.spec import spec_from_dict


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
