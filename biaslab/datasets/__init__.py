"""Datasets shipped with biaslab, with attribution.

Each dataset's files live under ``files/<name>/`` next to a SOURCE.md giving its origin,
license and checksums; the loaders here validate them and build leakage-safe splits.
"""

import importlib

# Resolved on first use (PEP 562): importing one dataset module (e.g. biaslab.datasets.bbq)
# must not load the student dataset's module and with it pandas (~0.5 s per `biaslab` start).
_HOME = {
    "student": ("CATEGORICAL_COLUMNS", "COLUMNS", "DATASETS", "FEATURE_COLUMNS",
                "NUMERIC_COLUMNS", "MLPredictor", "StudentSplit", "fit_ml_predictor",
                "load_student", "record_text", "split_student", "summary_text",
                "training_summary"),
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


__all__ = [
    "CATEGORICAL_COLUMNS",
    "COLUMNS",
    "DATASETS",
    "FEATURE_COLUMNS",
    "NUMERIC_COLUMNS",
    "MLPredictor",
    "StudentSplit",
    "fit_ml_predictor",
    "load_student",
    "record_text",
    "split_student",
    "summary_text",
    "training_summary",
]
