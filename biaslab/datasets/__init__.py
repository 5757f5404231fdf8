"""Datasets shipped with biaslab, with attribution.

Each dataset's files live under ``files/<name>/`` next to a SOURCE.md giving its origin,
license and checksums; the loaders here validate them and build leakage-safe splits.
"""

from biaslab.datasets.student import (
    CATEGORICAL_COLUMNS,
    COLUMNS,
    DATASETS,
    FEATURE_COLUMNS,
    NUMERIC_COLUMNS,
    MLPredictor,
    StudentSplit,
    fit_ml_predictor,
    load_student,
    record_text,
    split_student,
    summary_text,
    training_summary,
)

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
