"""What a model fit computes, kept on disk beside the shared response cache, so a new process
neither fits nor predicts again.

A fit's result (the amplification protocol's ML probabilities on a split's test rows) is a
pure function of what the model was fitted on and how: the training rows, the model's
parameters, the rows it predicts and the versions of the libraries that fit it. An entry's
key is a hash of all of them, so an entry is never used for other data or another model: a
changed data file, split or parameter makes a new entry, it does not reuse an old one.

Why results and not the fitted model: a later process (a `biaslab report`, a ``--workers``
process, a resumed run) needs the predictions, never the model itself, and a scikit-learn model
can only be read back safely through a format such as skops, whose import and type checks cost
a new process about 2 s of CPU, ten times the fit (~0.2 s per split). The model is fitted in
memory, once per process, only when a result is missing.

Where: a ``fits/`` directory next to the shared response cache's file (``$BIASLAB_CACHE``, by
default ``~/.cache/biaslab/fits/``). ``BIASLAB_CACHE=off`` and ``--no-cache`` turn it off:
nothing is read or written there (a strict replay still reads it: it never uses the response
cache, but fits are not responses).

It can never spoil a run, only slow it down:

- an entry is written to a temporary file and renamed into place, so a reader (another process
  included) sees a whole entry or none;
- an entry that cannot be read back (truncated, damaged, not ours) or holds something other
  than what its caller checks for is fitted again with one warning naming it, and replaced;
- a directory that cannot be written keeps fits in memory only, with one warning per process.

An entry cannot carry code, whoever wrote it (the directory is shared by design): entries are
JSON data (numbers, strings, lists), read with :func:`json.loads`, which constructs no object
of any other type; a pickle or any other file in an entry's place is simply unreadable JSON.
Callers check the values they load (`check`): the student model's probabilities, for
instance, must be as many floats in [0, 1] as the split has test rows.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from biaslab.traces.cache import shared_cache_path

__all__ = ["FORMAT", "SUFFIX", "cached_fit", "entry_path", "fits_directory", "fits_in",
           "fits_on_disk", "keep_fits_in", "no_fits_on_disk", "restore", "warn_line"]

T = TypeVar("T")
FORMAT = 3
"""Bumped when the entry layout changes: older entries then miss instead of being misread.
(1: pickles; 2: skops.io files of the model and its probabilities; 3: JSON results only.)"""
SUFFIX = ".json"

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
    """Where fitted results are kept: the caller's choice, else ``fits/`` next to the shared
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
def fits_on_disk(allowed: bool) -> Iterator[None]:
    """`no_fits_on_disk` for a ``with`` block unless `allowed`: what ``--no-cache`` (or
    ``no_cache=True``) does for a whole command, its report included, which reads the run's
    fitted results too."""
    token = None if allowed else no_fits_on_disk()
    try:
        yield
    finally:
        restore(token)


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
               check: Callable[[Any], bool] = lambda value: True,
               decode: Callable[[Any], Any] = lambda value: value) -> T:
    """``fit()``, or the result of an earlier process's ``fit()`` on the same `inputs`.

    Args:
        kind: a short name for the result (part of the file name).
        inputs: everything the result depends on, as JSON-able values (training data hash,
            model parameters, library versions). Two fits with equal inputs must give equal
            results.
        fit: computes the result when no readable entry exists: JSON data (a result that is
            not is returned but kept in memory only, with one warning).
        check: whether a loaded, decoded value is the kind of value `fit` returns.
        decode: turns the JSON read back into that kind (``tuple`` for a tuple, say: JSON has
            lists only).
    """
    directory = fits_directory()
    if directory is None:
        return fit()
    key = _key(kind, inputs)
    path = directory / f"{kind}-{key[:40]}{SUFFIX}"
    loaded = _load(path, key, check, decode)
    if loaded is not _UNSET:
        return loaded
    value = fit()
    _store(directory, path, key, value)
    return value


def _load(path: Path, key: str, check: Callable[[Any], bool],
          decode: Callable[[Any], Any]) -> Any:
    try:
        payload = json.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):  # no entry yet (or no directory)
        return _UNSET
    except Exception as exc:  # noqa: BLE001  (any damage: truncated, garbage, a pickle)
        _warn(f"the fitted result {path} cannot be read back ({type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:120]}); fitting it again")
        return _UNSET
    value = _checked(check, decode, payload.get("value")) if (
        isinstance(payload, dict) and payload.get("key") == key) else _UNSET
    if value is _UNSET:
        _warn(f"the fitted result {path} is not the fit it is named for; fitting it again")
    return value


def _checked(check: Callable[[Any], bool], decode: Callable[[Any], Any], raw: Any) -> Any:
    """The decoded value when it passes `check`, else `_UNSET`."""
    try:
        value = decode(raw)
        return value if check(value) else _UNSET
    except Exception:  # noqa: BLE001  (a value too odd to decode or check is not the fit)
        return _UNSET


def _store(directory: Path, path: Path, key: str, value: Any) -> None:
    kind = path.name.rsplit("-", 1)[0]
    try:
        data = json.dumps({"key": key, "value": value}, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:  # not JSON data: keep it in memory only
        _warn(f"a fitted result of kind {kind} is not JSON data ({exc}); it is not kept on "
              "disk", once_for=f"json:{kind}")
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
        _warn(f"cannot keep fitted results in {directory} ({reason}); they are "
              "fitted again in each new process", once_for=str(directory))
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
