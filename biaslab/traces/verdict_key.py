"""The run's verdict key: the secret that a judge's verdict markers are derived from.

Each judge prompt asks for its answer between markers ``<verdict-K>`` … ``</verdict-K>`` with
``K`` an HMAC of the prompt under this key (`biaslab.agents.verdicts`). The key is random and
appears in no prompt, so no model whose text is judged can know or guess a marker.

Where a run's key comes from, in order (`run_verdict_key`):

1. the run store's own meta (``verdict_key``): a resumed run keeps its key;
2. the first source store that has one: a shard takes its run's key, a strict or
   counterfactual replay and a judge-sensitivity run their source's, so their prompts are the
   source's byte for byte and its recorded answers are found;
3. the user's key file (`verdict_key_path`: ``<BIASLAB_CACHE>.verdict-key`` beside the shared
   response cache, else ``~/.cache/biaslab/verdict-key``; created once, mode 0600, replaced
   if damaged, with a warning), whether or not the run uses the shared cache: so the same job into a new
   directory renders the same judge prompts, and is answered from the cache when it has one;
4. a fresh random key, only where that file cannot be read or written: one warning names the
   file and the cost (the shared cache cannot answer this run's judge calls in a later run).

It is not a credential: knowing it lets one predict markers, which matters only to a model that
could put them in a judged text, and no model ever sees it.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Sequence

from biaslab.traces.store import RunStore

__all__ = ["run_verdict_key", "cache_verdict_key", "verdict_key_path", "META_KEY"]

META_KEY = "verdict_key"
_BYTES = 16


def _decode(value: object) -> bytes | None:
    if isinstance(value, str) and len(value) == 2 * _BYTES:
        try:
            return bytes.fromhex(value)
        except ValueError:
            return None
    return None


def verdict_key_path() -> Path:
    """Where the user's verdict key is kept: beside ``$BIASLAB_CACHE`` when that names a file,
    else in the user's cache directory (also under ``BIASLAB_CACHE=off``)."""
    env = os.environ.get("BIASLAB_CACHE")
    if env and env != "off":
        return Path(f"{env}.verdict-key")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "biaslab" / \
        "verdict-key"


_WARNED: set[tuple[str, str]] = set()
_EFFECT = ("judge prompts of runs made with another key differ, so the shared response cache "
           "will not answer their judge calls again")


def _warn(path: Path, problem: str, effect: str) -> None:
    """One line per file and problem per process (shards and replays ask again)."""
    if (str(path), problem) in _WARNED:
        return
    _WARNED.add((str(path), problem))
    sys.stderr.write(f"biaslab: warning: the verdict key file {path} {problem}; {effect}\n")
    sys.stderr.flush()


def cache_verdict_key(path: str | Path) -> bytes | None:
    """The key kept in the file at `path`, created on first use; None when it cannot be read
    or made (the run then takes a key of its own). Never silent: a file that cannot be read,
    one that holds no key (damaged: replaced by a new key) and one that cannot be created are
    each one warning naming the file and what it costs."""
    path = Path(path)
    damaged = False
    try:
        found = _decode(path.read_text(encoding="ascii").strip())
        if found is not None:
            return found
        damaged = True
    except UnicodeDecodeError:
        damaged = True
    except FileNotFoundError:
        pass
    except OSError as exc:  # there, but unreadable: replacing it would hide the problem
        _warn(path, f"cannot be read ({exc.strerror or exc})",
              f"this run takes a key of its own, and {_EFFECT} (make the file readable, or "
              "remove it to start a new key)")
        return None
    key = secrets.token_bytes(_BYTES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(key.hex())
        try:
            if damaged:  # unreadable as a key: replaced, so later runs share one again
                os.replace(temp, path)
                _warn(path, "held no key (damaged) and was replaced by a new key",
                      f"{_EFFECT} (runs from now on share the new key)")
            else:
                os.link(temp, path)  # never replaces a key another run wrote meanwhile
        except FileExistsError:
            pass
        finally:
            temp.unlink(missing_ok=True)
        return _decode(path.read_text(encoding="ascii").strip())
    except OSError as exc:
        _warn(path, f"cannot be created ({exc.strerror or exc})",
              f"this run takes a key of its own, and {_EFFECT} (make its directory writable "
              "or point BIASLAB_CACHE elsewhere)")
        return None


def run_verdict_key(store: RunStore, sources: Sequence[RunStore] = (),
                    key_file: str | Path | None = None) -> bytes:
    """The run's key (see the module docstring for the order), recorded in `store`'s meta;
    `key_file` is the user's key file (`verdict_key_path`), None to skip it."""
    own = _decode(store.meta().get(META_KEY))
    if own is not None:
        return own
    key = next((k for k in (_decode(s.meta().get(META_KEY)) for s in sources) if k), None)
    if key is None and key_file is not None:
        key = cache_verdict_key(key_file)
    key = key or secrets.token_bytes(_BYTES)
    store.set_meta(**{META_KEY: key.hex()})
    return key
