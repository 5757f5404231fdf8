"""UCI Student Performance data (Cortez & Silva, 2008) for the "amplification" protocol.

The protocol predicts whether a student fails the course (final grade G3 < 10) with sex as the
sensitive attribute. G3 defines the target, so it is dropped from every feature view here: no
agent prompt, record line or model input can see it. Everything an agent is told about the data
(`training_summary`) is computed from the training split alone, so test labels cannot leak.
Attribution and checksums of the shipped files: ``files/student/SOURCE.md``.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np
# pandas is imported inside the functions that use it: it costs ~0.5 s at the start of every
# `biaslab` command (this module is loaded to register the protocols), most of which read no data.
if TYPE_CHECKING:
    import pandas as pd

from biaslab.datasets import file_stamps, fit_cache
from biaslab.datasets.frame_rows import frame_rows
from biaslab.errors import UserError

if TYPE_CHECKING:  # scikit-learn is imported where a split is made or a model fitted: every
    from sklearn.pipeline import Pipeline  # `biaslab` command would otherwise pay ~0.6 s for it

__all__ = [
    "DATASETS",
    "COLUMNS",
    "FEATURE_COLUMNS",
    "NUMERIC_COLUMNS",
    "CATEGORICAL_COLUMNS",
    "StudentSplit",
    "MLPredictor",
    "load_student",
    "split_student",
    "training_summary",
    "summary_text",
    "record_text",
    "records_table",
    "visible_columns",
    "fit_ml_predictor",
    "ML_RANDOM_STATE",
    "data_stamp",
]

DATASETS = ("math", "por")
#: The ML predictor's classifier seed, fixed by the paper (the split seed varies per replicate).
ML_RANDOM_STATE = 42
_FILES = {"math": "student-mat.csv", "por": "student-por.csv"}

COLUMNS = (
    "school", "sex", "age", "address", "famsize", "Pstatus", "Medu", "Fedu", "Mjob", "Fjob",
    "reason", "guardian", "traveltime", "studytime", "failures", "schoolsup", "famsup", "paid",
    "activities", "nursery", "higher", "internet", "romantic", "famrel", "freetime", "goout",
    "Dalc", "Walc", "health", "absences", "G1", "G2", "G3",
)
NUMERIC_COLUMNS = (
    "age", "Medu", "Fedu", "traveltime", "studytime", "failures", "famrel", "freetime", "goout",
    "Dalc", "Walc", "health", "absences", "G1", "G2", "G3",
)
CATEGORICAL_COLUMNS = tuple(c for c in COLUMNS if c not in NUMERIC_COLUMNS)
#: What a model or agent may see: everything but the target-defining final grade.
FEATURE_COLUMNS = tuple(c for c in COLUMNS if c != "G3")
_GRADES = ("G1", "G2", "G3")
_HIDDEN = frozenset({"G3", "fail", "sex_code"})
_SEX_CODES = {"F": 0, "M": 1}

_KEY_FEATURES = ("G1", "G2", "studytime", "failures", "absences", "age", "Medu", "Fedu",
                 "Dalc", "Walc", "goout")
_SUMMARY_CATEGORICALS = ("higher", "internet", "romantic", "schoolsup", "address", "school")


def _r(x: float) -> float | None:
    """Round to 3 decimals as a plain float; NaN (empty group, constant column) becomes None."""
    x = float(x)
    return None if math.isnan(x) else round(x, 3)


def load_student(dataset: str, path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Read and validate one Student Performance CSV.

    Validation is strict because a silently dropped or misparsed row would change the
    protocol's fairness numbers without anyone noticing.

    Args:
        dataset: "math" (student-mat.csv) or "por" (student-por.csv).
        path: a user's own copy of that file; None reads the copy shipped with biaslab.

    Returns:
        The 33 original columns in file order (extra columns are ignored), G1/G2/G3 and other
        numeric columns as int, plus "fail" (G3 < 10) and "sex_code" (F=0, M=1). The index is
        the 0-based data row number in the file.

    Raises:
        UserError: one line naming the file and the problem.
    """
    if dataset not in DATASETS:
        raise UserError(f"unknown student dataset {dataset!r}; valid names: {', '.join(DATASETS)}")
    if path is None:
        ref = resources.files("biaslab.datasets").joinpath("files", "student", _FILES[dataset])
        with resources.as_file(ref) as p:
            return _parse(Path(p))
    return _parse(Path(path))


def _parse(path: Path) -> pd.DataFrame:
    import pandas as pd

    where = str(path)
    try:
        raw = pd.read_csv(path, sep=";", dtype=str, keep_default_na=False, na_filter=False)
    except FileNotFoundError:
        raise UserError(f"{where}: file not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        msg = " ".join(str(e).split())
        raise UserError(f"{where}: cannot read as a ';'-separated CSV: {msg}") from None
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        listed = ", ".join(repr(c) for c in missing)
        raise UserError(f"{where}: missing column{'s' if len(missing) > 1 else ''} {listed} "
                        f"(expected ';'-separated columns {';'.join(COLUMNS)})")
    if raw.empty:
        raise UserError(f"{where}: no data rows")
    df = raw.loc[:, list(COLUMNS)].copy()
    df.index = pd.RangeIndex(len(df))

    def err(col: str, i: int, problem: str) -> UserError:
        return UserError(f"{where}: {problem} in {col} at row {i} (line {i + 2})")

    for col in COLUMNS:
        values = df[col]
        blank = values.isna() | (values.astype(str).str.strip() == "")
        if blank.any():
            raise err(col, int(blank.idxmax()), "missing value")
    for col in NUMERIC_COLUMNS:
        text = df[col].str.strip()
        bad = ~text.str.fullmatch(r"[+-]?\d+")
        if bad.any():
            i = int(bad.idxmax())
            raise err(col, i, f"unparseable value {df[col][i]!r} (expected an integer)")
        df[col] = text.astype("int64")
    for col in _GRADES:
        bad = (df[col] < 0) | (df[col] > 20)
        if bad.any():
            i = int(bad.idxmax())
            raise err(col, i, f"grade {int(df[col][i])} out of range 0..20")
    bad = ~df["sex"].isin(list(_SEX_CODES))
    if bad.any():
        i = int(bad.idxmax())
        raise err("sex", i, f"value {df['sex'][i]!r} not in {{F, M}}")
    df["fail"] = (df["G3"] < 10).astype("int64")
    df["sex_code"] = df["sex"].map(_SEX_CODES).astype("int64")
    return df


@dataclass(frozen=True, eq=False)
class StudentSplit:
    """A seeded train/test split; frames hold features + "sex_code" + "fail", never G3.

    The index of both frames is the original row number, so results can be traced back to the
    CSV and disjointness checked.
    """

    dataset: str
    seed: int
    train: pd.DataFrame
    test: pd.DataFrame
    feature_columns: tuple[str, ...]

    @property
    def y_train(self) -> np.ndarray:
        """Training labels (1 = fail)."""
        return self.train["fail"].to_numpy(dtype=np.int64)

    @property
    def y_test(self) -> np.ndarray:
        """Test labels (1 = fail)."""
        return self.test["fail"].to_numpy(dtype=np.int64)

    @property
    def sex_train(self) -> np.ndarray:
        """Training sensitive attribute (F=0, M=1)."""
        return self.train["sex_code"].to_numpy(dtype=np.int64)

    @property
    def sex_test(self) -> np.ndarray:
        """Test sensitive attribute (F=0, M=1)."""
        return self.test["sex_code"].to_numpy(dtype=np.int64)


def split_student(df: pd.DataFrame, *, dataset: str, seed: int, test_size: float = 0.2,
                  max_test: int | None = None) -> StudentSplit:
    """Split a `load_student` frame, stratified on "fail", as the paper does (80/20).

    Args:
        df: output of `load_student`.
        dataset: which file `df` came from (recorded on the split).
        seed: `random_state` of the split (the protocol replicates 42, 43, 44).
        test_size: test fraction.
        max_test: for smoke runs, keep a seeded stratified subsample of this many test rows.
            The dropped test rows are *not* moved into train, so train is identical with or
            without `max_test` and leakage properties hold.

    Returns:
        A `StudentSplit` with both frames sorted by original row number.
    """
    if dataset not in DATASETS:
        raise UserError(f"unknown student dataset {dataset!r}; valid names: {', '.join(DATASETS)}")
    need = [c for c in (*FEATURE_COLUMNS, "sex_code", "fail") if c not in df.columns]
    if need:
        raise UserError(f"split_student: frame lacks columns {need}; "
                        "pass the output of load_student")
    if not 0.0 < test_size < 1.0:
        raise UserError(f"split_student: test_size must be in (0, 1), got {test_size}")
    if max_test is not None and max_test < 1:
        raise UserError(f"split_student: max_test must be a positive integer, got {max_test}")
    cols = [*FEATURE_COLUMNS, "sex_code", "fail"]
    failing = int(df["fail"].sum())
    size = f"the {dataset} data ({len(df)} rows, {failing} failing)"
    if df["fail"].nunique() < 2:
        raise UserError(f"{size} needs both passing and failing students (G3 >= 10 and < 10): "
                        "the ML predictor and the split are stratified on pass/fail")
    from sklearn.model_selection import train_test_split

    try:
        train_idx, test_idx = train_test_split(df.index.to_numpy(), test_size=test_size,
                                               stratify=df["fail"], random_state=seed)
    except ValueError as exc:  # too few rows of a class for a stratified split
        raise UserError(f"{size} is too small for a {1 - test_size:.0%}/{test_size:.0%} split "
                        f"stratified on pass/fail: {exc}") from None
    if max_test is not None and max_test < len(test_idx):
        y = df.loc[test_idx, "fail"]
        classes = y.nunique()
        if max_test >= classes and len(test_idx) - max_test >= classes:
            test_idx, _ = train_test_split(test_idx, train_size=max_test, stratify=y,
                                           random_state=seed)
        else:  # too small to stratify: a plain deterministic prefix
            test_idx = test_idx[:max_test]
    train = df.loc[np.sort(train_idx), cols].copy()
    test = df.loc[np.sort(test_idx), cols].copy()
    return StudentSplit(dataset=dataset, seed=seed, train=train, test=test,
                        feature_columns=FEATURE_COLUMNS)


def training_summary(split: StudentSplit) -> dict:
    """Statistics of the training split only, for the explanation agent's prompt.

    Only `split.train` is read, so nothing about the test records (which the agents are asked
    to judge) can leak through the summary. Floats are rounded to 3 decimals; the result holds
    plain Python types and is JSON-serialisable.
    """
    tr = split.train
    fail = tr["fail"]
    by_sex = {}
    for name, code in _SEX_CODES.items():
        grp = fail[tr["sex_code"] == code]
        by_sex[name] = {"n": int(len(grp)), "fail_rate": _r(grp.mean()) if len(grp) else None}
    groups = {
        "by_sex": {name: tr["sex_code"] == code for name, code in _SEX_CODES.items()},
        "by_outcome": {"fail": fail == 1, "pass": fail == 0},
    }
    # Means from exact integer sums (every key feature is an integer column): the same floats
    # as pandas' per-column mean (a float sum of integers is exact), in one pass per group.
    key_values = tr.loc[:, list(_KEY_FEATURES)].to_numpy(dtype=np.int64)
    means = {
        kind: {label: _group_means(key_values, mask.to_numpy()) for label, mask in masks.items()}
        for kind, masks in groups.items()
    }
    corr = []
    failing = fail.astype(float)
    for f in (c for c in NUMERIC_COLUMNS if c != "G3"):
        r = _r(tr[f].astype(float).corr(failing))
        if r is not None:
            corr.append((f, r))
    corr.sort(key=lambda fr: (-abs(fr[1]), fr[0]))
    failed = fail.tolist()
    categorical = {col: _rates_by_category(tr[col].astype(str).tolist(), failed)
                   for col in _SUMMARY_CATEGORICALS}
    return {
        "n_train": int(len(tr)),
        "fail_rate": _r(fail.mean()),
        "fail_rate_by_sex": by_sex,
        "feature_means": means,
        "correlation_with_fail": [[f, r] for f, r in corr[:10]],
        "fail_rate_by_category": categorical,
    }


def _group_means(values: np.ndarray, mask: np.ndarray) -> dict:
    n = int(mask.sum())
    if not n:
        return {f: None for f in _KEY_FEATURES}
    sums = values[mask].sum(axis=0)
    return {f: _r(int(total) / n) for f, total in zip(_KEY_FEATURES, sums)}


def _rates_by_category(categories: list[str], failed: list[int]) -> dict:
    """{category: {"n", "fail_rate"}} in sorted order, as a groupby would give (the rate of
    0/1 labels is an exact count over n, so the float is the same)."""
    counts: dict[str, list[int]] = {}
    for cat, f in zip(categories, failed):
        seen = counts.setdefault(cat, [0, 0])
        seen[0] += 1
        seen[1] += f
    return {cat: {"n": n, "fail_rate": _r(k / n)} for cat, (n, k) in sorted(counts.items())}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def summary_text(summary: dict) -> str:
    """Render `training_summary` as a few compact, deterministic lines for a prompt."""
    sex = summary["fail_rate_by_sex"]
    means = summary["feature_means"]
    cols = [("by_sex", "F"), ("by_sex", "M"), ("by_outcome", "fail"), ("by_outcome", "pass")]
    head = ["feature"] + [label for _, label in cols]
    rows = [[f] + [_fmt(means[kind][label][f]) for kind, label in cols]
            for f in means["by_sex"]["F"]]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    table = [" ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                      for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
             for r in [head, *rows]]
    lines = [
        f"Training data: n={summary['n_train']}, failure rate (final grade < 10) = "
        f"{_fmt(summary['fail_rate'])}",
        "Failure rate by sex: " + ", ".join(
            f"{s} {_fmt(v['fail_rate'])} (n={v['n']})" for s, v in sex.items()),
        "Mean of key features by group (sex; fail/pass):",
        *("  " + t for t in table),
        "Correlation with failure (top 10 by |r|): " + ", ".join(
            f"{f} {r:+.3f}" for f, r in summary["correlation_with_fail"]),
        "Failure rate by category:",
        *(f"  {col}: " + ", ".join(f"{cat} {_fmt(v['fail_rate'])} (n={v['n']})"
                                  for cat, v in cats.items())
          for col, cats in summary["fail_rate_by_category"].items()),
    ]
    return "\n".join(lines)


def record_text(row: pd.Series, feature_columns) -> str:
    """One record as ``"school=GP sex=F age=18 ... G1=5 G2=6"`` for an agent prompt.

    G3, "fail" and "sex_code" are skipped even if listed, since any of them would reveal the
    label (sex itself is shown in its raw form, as a feature).
    """
    return " ".join(f"{c}={row[c]}" for c in feature_columns if c not in _HIDDEN)


def visible_columns(feature_columns) -> list[str]:
    """The feature columns an agent may see (never G3, fail or sex_code)."""
    return [c for c in feature_columns if c not in _HIDDEN]


def records_table(frame: pd.DataFrame, feature_columns) -> str:
    """Several records as a compact table: one ``Columns:`` header, then numbered rows of
    comma-separated values. About half the tokens of `record_text` per record, which matters
    on a small local model; the same hidden columns are skipped."""
    columns = visible_columns(feature_columns)
    rows = [f"{i + 1}. " + ",".join(map(str, values))  # (iterrows is ~20x slower)
            for i, values in enumerate(frame_rows(frame, *columns))]
    return "\n".join([f"Columns: {','.join(columns)}", *rows])


@dataclass
class MLPredictor:
    """The protocol's non-LLM predictor: scaling + one-hot + gradient boosting, fit on train only.

    Attributes:
        pipeline: fitted sklearn Pipeline (ColumnTransformer -> GradientBoostingClassifier).
        feature_columns: columns the pipeline reads, in order.
        seed: random_state of the classifier, always `ML_RANDOM_STATE`; the replicate seed only
            moves the split.
    """

    pipeline: Pipeline
    feature_columns: tuple[str, ...]
    seed: int

    def predict_proba(self, frame: pd.DataFrame) -> np.ndarray:
        """Failure probability per row of `frame` (which needs the feature columns)."""
        return self.pipeline.predict_proba(frame.loc[:, list(self.feature_columns)])[:, 1]

    def evaluate(self, split: StudentSplit) -> dict:
        """Accuracy (threshold 0.5) and ROC AUC on the test split; AUC is None if one class."""
        return anchor_scores(split.y_test, self.predict_proba(split.test))


def anchor_scores(y_true, p_fail) -> dict:
    """The ML anchor's scores from its probabilities: accuracy at the 0.5 threshold
    (P(fail) >= 0.5 predicts a fail) and ROC AUC, None where the rows hold one class only."""
    from sklearn.metrics import accuracy_score, roc_auc_score

    y = np.asarray(y_true)
    p = np.asarray(p_fail, dtype=float)
    auc = float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else None
    return {"accuracy": float(accuracy_score(y, (p >= 0.5).astype(int))), "auc": auc}


def fit_ml_predictor(split: StudentSplit) -> MLPredictor:
    """Fit the baseline on `split.train` only (scaler and encoder statistics included).

    The classifier is seeded with `ML_RANDOM_STATE` (42), as the paper states, whatever the
    split's seed: replicates 42, 43 and 44 differ in their data split, not in the booster's
    subsampling, so the ML anchor varies only with the data.
    """
    feats = split.feature_columns
    pipe = _ml_pipeline(feats)
    pipe.fit(split.train.loc[:, list(feats)], split.y_train)
    return MLPredictor(pipeline=pipe, feature_columns=tuple(feats), seed=ML_RANDOM_STATE)


def _ml_pipeline(feats) -> Pipeline:
    """The unfitted baseline: scaling + one-hot + the paper's gradient boosting."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numeric = [c for c in feats if c in NUMERIC_COLUMNS]
    categorical = [c for c in feats if c not in NUMERIC_COLUMNS]
    pre = ColumnTransformer([
        ("num", StandardScaler(), numeric),
        ("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False), categorical),
    ])
    clf = GradientBoostingClassifier(n_estimators=100, max_depth=4, learning_rate=0.1,
                                     subsample=0.8, random_state=ML_RANDOM_STATE)
    return Pipeline([("pre", pre), ("gbc", clf)])


def fit_inputs(split: StudentSplit, table_digest: str) -> dict:
    """Everything `fit_ml_predictor(split)` depends on, for its entry on disk
    (biaslab.datasets.fit_cache): the data (`table_digest` of the frame the split was cut from,
    and the numbers of the training rows, which together fix the exact rows and labels the
    model sees: the data file, the split seed and the split code are all covered), the model's
    parameters, and the versions of the libraries that fit it and compute its predictions."""
    import pandas as pd

    import sklearn

    return {"table": table_digest, "train_rows": rows_digest(split.train),
            "features": list(split.feature_columns),
            "model": {name: _plain(value) for name, value
                      in _ml_pipeline(split.feature_columns).get_params(deep=True).items()},
            "versions": {"scikit-learn": sklearn.__version__, "numpy": np.__version__,
                         "pandas": pd.__version__}}


def rows_digest(frame: pd.DataFrame) -> str:
    """A hash of which rows of the data table `frame` holds (its row numbers, in order)."""
    return hashlib.sha256(frame.index.to_numpy(dtype=np.int64).tobytes()).hexdigest()


def table_digest(df: pd.DataFrame) -> str:
    """A hash of a `load_student` frame's content: values, row numbers, columns and dtypes."""
    import pandas as pd

    digest = hashlib.sha256(pd.util.hash_pandas_object(df, index=True).to_numpy().tobytes())
    digest.update(repr([(c, str(t)) for c, t in df.dtypes.items()]).encode())
    return digest.hexdigest()


# -- shared views: every cell, report and test of a dataset × seed uses one split and one model --
# Sized for a grid of many seeds: a split and a fitted model take well under a megabyte, and a
# cache smaller than datasets × seeds re-reads and re-fits on every cell once cells interleave.
# Every cache below is keyed on the data file's stamp (`data_stamp`) as well as its name,
# taken afresh on each call: a file edited between two runs of one process (a notebook) is
# read again, split again and fitted again, as a fresh process would.
def data_stamp(dataset: str, data_dir: str | None) -> tuple | None:
    """The stamp (`biaslab.datasets.file_stamps`) of the file `dataset` is read from:
    ``data_dir``'s copy, or None for the copy shipped with biaslab (which a run never edits)."""
    if not data_dir:
        return None
    return file_stamps.file_stamp(Path(data_dir) / _FILES[dataset])


@lru_cache(maxsize=8)
def _cached_table(dataset: str, data_dir: str | None, stamp: tuple | None) -> pd.DataFrame:
    path = Path(data_dir) / _FILES[dataset] if data_dir else None
    return load_student(dataset, path)


_ONE_AT_A_TIME: dict[tuple, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _single_flight(name: str, key: tuple) -> threading.Lock:
    """One lock per (cache, key): the first caller computes, the others wait for its result
    instead of each computing it again (an lru_cache alone lets every thread that misses at
    once fit the same model)."""
    with _LOCKS_GUARD:
        return _ONE_AT_A_TIME.setdefault((name, *key), threading.Lock())


@lru_cache(maxsize=256)
def _split(dataset: str, seed: int, max_test: int | None, data_dir: str | None,
           stamp: tuple | None) -> StudentSplit:
    # (split_student only reads the table, and copies the rows it keeps)
    return split_student(_cached_table(dataset, data_dir, stamp), dataset=dataset, seed=seed,
                         max_test=max_test)


def _plain(value):
    """A parameter as JSON-able data: a nested estimator by its class (its own parameters are
    listed beside it in ``get_params(deep=True)``), which is cheaper than its repr."""
    if hasattr(value, "get_params"):
        return f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@lru_cache(maxsize=256)
def _predictor(dataset: str, seed: int, max_test: int | None, data_dir: str | None,
               stamp: tuple | None) -> MLPredictor:
    # In memory only: a later process needs the model's probabilities, which are kept on disk
    # (cached_test_probabilities), never the model. Fitting it again takes ~0.2 s of CPU;
    # reading a scikit-learn model back safely (skops) cost a new process ~2 s of imports.
    return fit_ml_predictor(_split_once((dataset, seed, max_test, data_dir, stamp)))


@lru_cache(maxsize=8)
def _table_digest(dataset: str, data_dir: str | None, stamp: tuple | None) -> str:
    return table_digest(_cached_table(dataset, data_dir, stamp))


@lru_cache(maxsize=256)
def _fit_inputs(dataset: str, seed: int, max_test: int | None, data_dir: str | None,
                stamp: tuple | None) -> dict:
    """`fit_inputs` of a cached split, computed once for its fit and its predictions."""
    return fit_inputs(_split_once((dataset, seed, max_test, data_dir, stamp)),
                      _table_digest(dataset, data_dir, stamp))


def _split_once(key: tuple) -> StudentSplit:
    with _single_flight("split", key):
        return _split(*key)


def cached_split(dataset: str, seed: int, max_test: int | None = None,
                 data_dir: str | None = None) -> StudentSplit:
    """The split of `dataset` for replicate `seed` (the shipped copy, or ``data_dir``'s),
    made once per process and data file content however many cells ask at the same time."""
    return _split_once((dataset, seed, max_test, data_dir, data_stamp(dataset, data_dir)))


def cached_test_probabilities(dataset: str, seed: int, max_test: int | None = None,
                              data_dir: str | None = None) -> tuple[float, ...]:
    """The ML predictor's P(fail) per test row of `cached_split`, in row order; the model is
    fitted on the split's training rows once per process and data file content, however many
    cells ask at the same time, and only when no entry holds its probabilities.

    Kept on disk as JSON (biaslab.datasets.fit_cache; a pure function of the fit's inputs and
    the test rows), so a new process neither fits the model nor runs it: it reads the
    entry. An entry is used only when it holds one float in [0, 1] per test row."""
    key = (dataset, seed, max_test, data_dir, data_stamp(dataset, data_dir))
    split = _split_once(key)
    inputs = {**_fit_inputs(*key), "test_rows": rows_digest(split.test)}

    def predict() -> tuple[float, ...]:
        with _single_flight("predictor", key):
            predictor = _predictor(*key)
        return tuple(float(p) for p in predictor.predict_proba(split.test))

    return fit_cache.cached_fit(
        "student-ml-test-p", inputs, predict, decode=tuple,
        check=lambda value: len(value) == len(split.test)
        and all(type(p) is float and 0.0 <= p <= 1.0 for p in value))
