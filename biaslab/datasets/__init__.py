"""Datasets shipped with biaslab, with attribution.

Each dataset's files live under ``files/<name>/`` next to a SOURCE.md giving its origin,
license and checksums; the loaders here validate them and build leakage-safe splits.
"""

from biaslab.lazy_exports import lazy_exports

# Resolved on first use (PEP 562): importing one dataset module (e.g. biaslab.datasets.bbq)
# must not load the student dataset's module and with it pandas (~0.5 s per `biaslab` start).
__getattr__, __dir__ = lazy_exports(__name__, {
    "student": ("CATEGORICAL_COLUMNS", "COLUMNS", "DATASETS", "FEATURE_COLUMNS",
                "NUMERIC_COLUMNS", "MLPredictor", "StudentSplit", "fit_ml_predictor",
                "load_student", "record_text", "split_student", "summary_text",
                "training_summary"),
})


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
