"""Spec loading, grid planning, the runner, replay and reports."""

import importlib

# Resolved on first use (PEP 562): every `biaslab` command imports a module of this package
# (e.g. interrupts), which must not pull in the planner, the runner and LangGraph (~1 s).
_HOME = {
    "plan": ("Cell", "Plan", "make_plan"),
    "runner": ("RunResult", "run_plan"),
    "spec": ("ExperimentSpec", "load_spec", "spec_from_dict"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_MODULE_OF})


__all__ = ["Cell", "ExperimentSpec", "Plan", "RunResult", "load_spec", "make_plan", "run_plan",
           "spec_from_dict"]
