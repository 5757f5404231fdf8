"""Where the BiasLens authors' released answers are, as published: a folder or the tarball.

The origin repository's answers are large (about 470 MB for six models), so a copy may ship
some models as a folder (``answers/`` and ``results/``) and others packed as a ``.tar.xz`` of
the same two folders. `release_root` makes either one a folder the readers of
`biaslab.datasets.biaslens_answers` can read: a tarball is unpacked once into a cache folder
named by its content hash, so a second call (a second test session, a second command) costs
nothing, and a half-finished unpacking is never taken for a finished one.

`duplicate_files` finds answer files that are byte-identical across models of one condition
(the published release has one such error: Qwen's three ``body`` files are DeepSeek's), so a
table can say so instead of comparing a model with a copy of another.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from biaslab.errors import UserError

__all__ = ["release_root", "release_cache_dir", "duplicate_files", "DuplicateFile"]

_DONE = ".unpacked"


def release_cache_dir() -> Path:
    """Where unpacked tarballs are kept: ``$BIASLAB_RELEASE_CACHE``, else the user's cache
    (``~/.cache/biaslab/releases``)."""
    env = os.environ.get("BIASLAB_RELEASE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "biaslab" / "releases"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def release_root(path: str | Path, cache: str | Path | None = None) -> Path:
    """A folder holding ``answers/`` (and ``results/``) for `path`: the folder itself, or a
    ``.tar.xz``/``.tar`` release unpacked into `cache` (default `release_cache_dir`) under its
    sha256.

    Raises:
        UserError: `path` is missing, not a tar archive, or holds no ``answers/`` folder.
    """
    path = Path(path)
    if path.is_dir():
        return path
    if not path.is_file():
        raise UserError(f"no BiasLens release at {path}")
    try:
        digest = _digest(path)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    target = Path(cache or release_cache_dir()) / digest[:16]
    if not (target / _DONE).is_file():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            with tarfile.open(path) as archive:
                archive.extractall(partial, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"cannot unpack {path}: {first.rstrip(':')} (a BiasLens release is "
                            "a folder, or a .tar.xz of its answers/ and results/)") from None
        (partial / _DONE).write_text(digest + "\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    if not (target / "answers").is_dir():
        raise UserError(f"{path} holds no answers/ folder (a BiasLens release packs "
                        f"answers/ and results/)")
    return target


@dataclass(frozen=True)
class DuplicateFile:
    """An answer file of `model` byte-identical to the same file of `copy_of`."""

    condition: str
    model: str
    copy_of: str
    name: str


def duplicate_files(roots: list[Path], conditions: tuple[str, ...] = ("role", "without_role")
                    ) -> list[DuplicateFile]:
    """Answer files identical, byte for byte, to the same-named file of another model of the
    same condition, across every root. The later model in name order is the copy."""
    found = []
    for condition in conditions:
        by_hash: dict[tuple[str, str], list[str]] = {}
        for root in roots:
            folder = Path(root) / "answers" / condition
            if not folder.is_dir():
                continue
            for model_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
                for file in sorted(model_dir.glob("*.csv")):
                    by_hash.setdefault((file.name, _digest(file)), []).append(model_dir.name)
        for (name, _), models in sorted(by_hash.items()):
            models = sorted(set(models))
            found.extend(DuplicateFile(condition, copy, models[0], name) for copy in models[1:])
    return found
