"""Spec loading, grid planning, the runner, replay and reports."""

from biaslab.experiments.plan import Cell, Plan, make_plan
from biaslab.experiments.runner import RunResult, run_plan
from biaslab.experiments.spec import ExperimentSpec, load_spec, spec_from_dict

__all__ = ["Cell", "ExperimentSpec", "Plan", "RunResult", "load_spec", "make_plan", "run_plan",
           "spec_from_dict"]
