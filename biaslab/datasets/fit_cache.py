"""Fitted models (and their predictions) kept on disk beside the shared response cache, so a
new process skips the fits.

A fitted predictor is a pure function of what it was fitted on and how: the training rows, the
model's parameters, and the versions of the libraries that fit and load it. An entry's key is a
hash of all of them, so an entry is never used for other data or another model: a changed data
file, split or parameter makes a new entry, it does not reuse an old one.

Where: a ``fits/`` directory next to the shared response cache's file (``$BIASLAB_CACHE``, by
default ``~/.cache/biaslab/fits/``). ``BIASLAB_CACHE=off`` and ``--no-cache`` turn it off:
nothing is read or written there (a strict replay still reads it: it never uses the response
cache, but fits are not responses).

It can never spoil a run, only slow it down:

- an entry is written to a temporary file and renamed into place, so a reader (another process
  included) sees a whole entry or none;
- an entry that cannot be read back (truncated, damaged, not ours) is fitted again with one
  warning naming it, and replaced;
- a directory that cannot be written keeps fits in memory only, with one warning per process.

An entry cannot carry code, whoever wrote it (the directory is shared by design): entries are
``skops.io`` files, not pickles. Before one is loaded, every type it names is checked against
`WRITTEN_TYPES`, the scikit-learn, numpy and builtin types biaslab itself writes, and skops
loads it with its own trusted-types check on top; an entry naming anything else is refused
(fitted again with one warning), never constructed. Callers check what they load (`check`):
the student model's trees, for instance, are checked to index only nodes and features they
have, since a crafted tree could otherwise read out of bounds when it predicts.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import io
import os
import sys
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from biaslab.traces.cache import shared_cache_path

__all__ = ["FORMAT", "WRITTEN_TYPES", "SUFFIX", "cached_fit", "entry_path", "fits_directory",
           "fits_in", "keep_fits_in", "no_fits_on_disk", "restore", "warn_line"]

T = TypeVar("T")
FORMAT = 2
"""Bumped when the entry layout changes: older entries then miss instead of being misread.
(1: pickles; 2: skops.io files.)"""
SUFFIX = ".skops"

WRITTEN_TYPES: frozenset[str] = frozenset({
    # containers and scalars
    "builtins.dict", "builtins.list", "builtins.tuple", "builtins.str", "builtins.int",
    "builtins.float", "builtins.bool", "builtins.NoneType", "builtins.slice",
    # numpy data
    "numpy.ndarray", "numpy.random.mtrand.RandomState",
    # the student model: scaling + one-hot + gradient boosting (datasets/student.py)
    "sklearn.pipeline.Pipeline", "sklearn.compose._column_transformer.ColumnTransformer",
    "sklearn.preprocessing._data.StandardScaler",
    "sklearn.preprocessing._encoders.OneHotEncoder",
    "sklearn.ensemble._gb.GradientBoostingClassifier", "sklearn.dummy.DummyClassifier",
    "sklearn.tree._classes.DecisionTreeRegressor", "sklearn.tree._tree.Tree",
    "sklearn._loss._loss.CyHalfBinomialLoss", "sklearn._loss.loss.HalfBinomialLoss",
    "sklearn._loss.link.LogitLink", "sklearn._loss.link.Interval",
})
"""Every type an entry may name: what biaslab's own fits are made of. numpy scalar types
(``numpy.float64``, ``numpy.int64``...) are allowed too, as array and value dtypes: data, not
code. Anything else, and the entry is refused before it is loaded."""

# Beyond skops's default-trusted types, the only one our fits need: the trees' node storage.
# (skops leaves it out of its defaults because a crafted one can index out of bounds when it
# predicts; callers check the trees they load: see datasets/student.py.)
_SKOPS_TRUSTED = ["sklearn.tree._tree.Tree"]

_UNSET = object()
# A caller's choice for the code it runs (a run with --no-cache, a benchmark): a Path, None
# (off) or _UNSET (follow BIASLAB_CACHE). A ContextVar, so it follows the run's tasks and the
# threads they fit in (asyncio.to_thread copies the context), and nothing else.
_CHOSEN: contextvars.ContextVar[Any] = contextvars.ContextVar("biaslab_fits", default=_UNSET)
_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()


def warn_line(message: str) -> None:
    """``biaslab: warning: MESSAGE`` on stderr as one write, under one lock: fits on parallel
    threads never share a line (``print`` writes the text and its newline separately)."""
    with _WARN_LOCK:
        sys.stderr.write(f"biaslab: warning: {message}\n")
        sys.stderr.flush()


def _warn(message: str, once_for: str | None = None) -> None:
    if once_for is not None:
        with _WARN_LOCK:
            if once_for in _WARNED:
                return
            _WARNED.add(once_for)
    warn_line(message)


def fits_directory() -> Path | None:
    """Where fitted models are kept: the caller's choice, else ``fits/`` next to the shared
    response cache's file; None when off."""
    chosen = _CHOSEN.get()
    if chosen is not _UNSET:
        return chosen
    cache = shared_cache_path()
    return None if cache is None else cache.parent / "fits"


def keep_fits_in(directory: str | os.PathLike | None) -> contextvars.Token:
    """Keep fits in `directory` (None: nowhere) for the current context; `restore` undoes it."""
    return _CHOSEN.set(None if directory is None else Path(directory))


def no_fits_on_disk() -> contextvars.Token | None:
    """``--no-cache``: no fits on disk for the current context, unless a caller chose a
    directory explicitly (`keep_fits_in`). Returns the token for `restore`."""
    if _CHOSEN.get() is not _UNSET:
        return None
    return _CHOSEN.set(None)


def restore(token: contextvars.Token | None) -> None:
    if token is not None:
        _CHOSEN.reset(token)


@contextmanager
def fits_in(directory: str | os.PathLike | None) -> Iterator[None]:
    """`keep_fits_in` for a ``with`` block."""
    token = keep_fits_in(directory)
    try:
        yield
    finally:
        restore(token)


def _key(kind: str, inputs: dict) -> str:
    text = json.dumps({"format": FORMAT, "kind": kind, "python": sys.version_info[:2],
                       **inputs}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_path(directory: Path, kind: str, inputs: dict) -> Path:
    """The file that holds the fit of `kind` on `inputs` (whether or not it exists yet)."""
    return directory / f"{kind}-{_key(kind, inputs)[:40]}{SUFFIX}"


def cached_fit(kind: str, inputs: dict, fit: Callable[[], T],
               check: Callable[[Any], bool] = lambda value: True) -> T:
    """``fit()``, or the result of an earlier process's ``fit()`` on the same `inputs`.

    Args:
        kind: a short name for the model (part of the file name).
        inputs: everything the fit depends on, as JSON-able values (training data hash, model
            parameters, library versions). Two fits with equal inputs must give equal models.
        fit: makes the model when no readable entry exists.
        check: whether a loaded value is the kind of object `fit` returns.
    """
    directory = fits_directory()
    if directory is None:
        return fit()
    key = _key(kind, inputs)
    path = directory / f"{kind}-{key[:40]}{SUFFIX}"
    loaded = _load(path, key, check)
    if loaded is not _UNSET:
        return loaded
    value = fit()
    _store(directory, path, key, value)
    return value


class _Refused(Exception):
    """An entry that names a type biaslab does not write."""


def _named_types(data: bytes) -> set[str]:
    """Every type an entry's schema names (each node's class, and the content of the nodes
    that name a type or function), read as JSON: nothing in the entry is constructed."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        schema = json.loads(archive.read("schema.json"))
    named: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "__loader__" in node or "__class__" in node:
                named.add(f"{node.get('__module__')}.{node.get('__class__')}")
            if node.get("__loader__") in {"FunctionNode", "MethodNode", "OperatorFuncNode"}:
                named.add(f"function:{json.dumps(node.get('content'), sort_keys=True)}")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return named


def _foreign(named: set[str]) -> list[str]:
    return sorted(name for name in named if name not in WRITTEN_TYPES
                  and not _is_numpy_scalar(name))


def _is_numpy_scalar(name: str) -> bool:
    import numpy as np

    module, _, attr = name.rpartition(".")
    kind = getattr(np, attr, None) if module == "numpy" else None
    return isinstance(kind, type) and issubclass(kind, np.generic)


def _load(path: Path, key: str, check: Callable[[Any], bool]) -> Any:
    import skops.io as sio

    try:
        data = path.read_bytes()
        foreign = _foreign(_named_types(data))
        if foreign:
            raise _Refused(", ".join(foreign))
        payload = sio.loads(data, trusted=_SKOPS_TRUSTED)
    except (FileNotFoundError, NotADirectoryError):  # no entry yet (or no directory)
        return _UNSET
    except _Refused as exc:
        _warn(f"the fitted model {path} names types biaslab does not write ({str(exc)[:120]}); "
              "refusing to load it, fitting it again")
        return _UNSET
    except Exception as exc:  # noqa: BLE001  (any damage: truncated, garbage, untrusted)
        _warn(f"the fitted model {path} cannot be read back ({type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:120]}); fitting it again")
        return _UNSET
    if not (isinstance(payload, dict) and payload.get("key") == key
            and _checked(check, payload.get("value"))):
        _warn(f"the fitted model {path} is not the fit it is named for; fitting it again")
        return _UNSET
    return payload["value"]


def _checked(check: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(check(value))
    except Exception:  # noqa: BLE001  (a value too odd to check is not the fit)
        return False


def _store(directory: Path, path: Path, key: str, value: Any) -> None:
    import skops.io as sio

    kind = path.name.rsplit("-", 1)[0]
    try:
        data = sio.dumps({"key": key, "value": value}, compression=zipfile.ZIP_DEFLATED)
        foreign = _foreign(_named_types(data))
    except Exception as exc:  # noqa: BLE001  (a value skops cannot write)
        foreign = [f"{type(exc).__name__}: {exc}"]
    if foreign:  # it would be refused on load: keep it in memory only
        _warn(f"a fitted model of kind {kind} holds types not in fit_cache.WRITTEN_TYPES "
              f"({', '.join(foreign)[:120]}); it is not kept on disk", once_for=f"types:{kind}")
        return
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)  # atomic: readers see the whole entry or none
        tmp = None
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or exc
        _warn(f"cannot keep fitted models in {directory} ({reason}); they are "
              "fitted again in each new process", once_for=str(directory))
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
