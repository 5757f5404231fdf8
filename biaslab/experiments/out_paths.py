"""The rules every verb's ``--out`` obeys, checked before any work (one line, exit 2).

A verb that learns its output path is unusable only when it first writes there has already
spent seconds to hours (a rescore with ``--sensitivity`` pays alternate judges first), and a
path inside the run it reads from would have it write into its own source (a rescore into
``RUN/tables/x`` or ``RUN`` itself re-reads what it just wrote). So every ``--out`` is
refused up front when it:

- holds a control character (a newline pasted with the path, a tab): such a name is almost
  never meant, and it breaks every line of output that names it;
- is a file (each verb writes a directory), or lies under a file;
- lies inside (or is) the source run of a verb that reads one (replay, rescore, merge).
"""

from __future__ import annotations

import shutil
import unicodedata
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from biaslab.errors import UserError

__all__ = ["built_beside", "check_out"]


def check_out(out: str | Path | None, *, sources: Iterable[str | Path] = (),
              flag: str = "--out") -> None:
    """Refuse an output directory that cannot be used (module docstring); None passes."""
    if out is None:
        return
    text = str(out)
    bad = next((c for c in text if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise UserError(f"cannot use {flag} {text!r}: its name holds a control character "
                        f"({bad!r}); give a plain directory name")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UserError(f"cannot use {flag} {text}: it is a file, and this command writes a "
                        "directory; give a new or existing directory")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"cannot use {flag} {text}: {parent} is a file, not a "
                                "directory")
            break
    resolved = path.resolve()
    for source in sources:
        run = Path(source).resolve()
        if resolved == run or run in resolved.parents:
            raise UserError(f"cannot use {flag} {text}: it is inside the source run {source}, "
                            "which this command reads; give a directory outside it")


@contextmanager
def built_beside(out: Path) -> Iterator[Path]:
    """A hidden folder beside `out` to build a whole run in, renamed to `out` when the block
    ends and removed if it fails: an import stopped halfway leaves no half-written run."""
    tmp = out.with_name(f".{out.name}.importing")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        yield tmp
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
