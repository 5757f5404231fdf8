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

Entries are pickles, read only from the user's own cache directory, like the response cache:
point ``BIASLAB_CACHE`` only at a directory you trust.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import pickle
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from biaslab.traces.cache import shared_cache_path

__all__ = ["FORMAT", "cached_fit", "entry_path", "fits_directory", "fits_in", "keep_fits_in",
           "no_fits_on_disk", "restore"]

T = TypeVar("T")
FORMAT = 1
"""Bumped when the entry layout changes: older entries then miss instead of being misread."""

_UNSET = object()
# A caller's choice for the code it runs (a run with --no-cache, a benchmark): a Path, None
# (off) or _UNSET (follow BIASLAB_CACHE). A ContextVar, so it follows the run's tasks and the
# threads they fit in (asyncio.to_thread copies the context), and nothing else.
_CHOSEN: contextvars.ContextVar[Any] = contextvars.ContextVar("biaslab_fits", default=_UNSET)
_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()


def _warn(message: str, once_for: str | None = None) -> None:
    if once_for is not None:
        with _WARN_LOCK:
            if once_for in _WARNED:
                return
            _WARNED.add(once_for)
    print(f"biaslab: warning: {message}", file=sys.stderr, flush=True)


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
    return directory / f"{kind}-{_key(kind, inputs)[:40]}.pkl"


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
    path = directory / f"{kind}-{key[:40]}.pkl"
    loaded = _load(path, key, check)
    if loaded is not _UNSET:
        return loaded
    value = fit()
    _store(directory, path, key, value)
    return value


def _load(path: Path, key: str, check: Callable[[Any], bool]) -> Any:
    try:
        with open(path, "rb") as handle:
            payload = pickle.load(handle)
    except (FileNotFoundError, NotADirectoryError):  # no entry yet (or no directory)
        return _UNSET
    except Exception as exc:  # noqa: BLE001  (any damage: truncated, garbage, foreign classes)
        _warn(f"the fitted model {path} cannot be read back ({type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:120]}); fitting it again")
        return _UNSET
    if not (isinstance(payload, dict) and payload.get("key") == key
            and check(payload.get("value"))):
        _warn(f"the fitted model {path} is not the fit it is named for; fitting it again")
        return _UNSET
    return payload["value"]


def _store(directory: Path, path: Path, key: str, value: Any) -> None:
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            pickle.dump({"key": key, "value": value}, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # atomic: readers see the whole entry or none
        tmp = None
    except (OSError, pickle.PicklingError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        _warn(f"cannot keep fitted models in {directory} ({reason}); they are "
              "fitted again in each new process", once_for=str(directory))
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
