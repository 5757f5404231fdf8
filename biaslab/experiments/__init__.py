"""Spec loading, grid planning, the runner, replay and reports."""

from biaslab.lazy_exports import lazy_exports

# Resolved on first use (PEP 562): every `biaslab` command imports a module of this package
# (e.g. interrupts), which must not pull in the planner, the runner and LangGraph (~1 s).
__getattr__, __dir__ = lazy_exports(__name__, {
    "plan": ("Cell", "Plan", "make_plan"),
    "runner": ("RunResult", "run_plan"),
    "spec": ("ExperimentSpec", "load_spec", "spec_from_dict"),
})


__all__ = ["Cell", "ExperimentSpec", "Plan", "RunResult", "load_spec", "make_plan", "run_plan",
           "spec_from_dict"]
