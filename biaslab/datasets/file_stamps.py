"""What an in-process cache of a data file is keyed on, besides the file's name.

A notebook runs `biaslab.run(spec)`, edits the data file, and runs it again in the same
process: a cache keyed on the path alone would hand the second run the old file's rows (and
the fits made from them). Every cache of a data file in biaslab therefore takes the file's
*stamp* as part of its key, taken afresh on every use: an `os.stat` costs microseconds, so
checking it on every call is cheap, and any write (or a file swapped in by rename) changes it.

The stamp is the file's resolved path, inode, size, and modification and status-change times
in nanoseconds. An edit that keeps the size still moves the times (status-change time cannot
be set back by a user), and a replacement by rename changes the inode.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["file_stamp", "tree_stamp"]

Stamp = tuple


def file_stamp(path: str | os.PathLike | None) -> Stamp | None:
    """The stamp of one file, or None for no path or a file that cannot be stat'ed (its
    reader then raises the clear error; exceptions are never cached)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def tree_stamp(root: str | os.PathLike | None) -> Stamp | None:
    """The stamps of every file under a directory (a question bank, a data directory), in
    path order: adding, removing or editing any file changes it. A file path gives its own
    stamp; None or a missing path gives None."""
    if root is None:
        return None
    top = Path(root)
    if not top.is_dir():
        return file_stamp(top)
    stamps = []
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            stamps.append(file_stamp(Path(folder) / name))
    return (str(top.resolve()), tuple(stamps))
