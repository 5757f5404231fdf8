"""One Markdown table writer for every report's ``tables/*.md``.

GitHub-flavoured, with no ``tabulate`` dependency: (Multi)index levels become leading columns,
pipes and newlines in cells are escaped, NaN is an empty cell.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

__all__ = ["to_markdown"]


def _cell(x: Any, digits: int | None) -> str:
    if isinstance(x, float) and digits is not None:
        s = "" if math.isnan(x) else f"{x:.{digits}g}"
    else:
        s = str(x)
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(df: pd.DataFrame, *, index: bool = True, digits: int | None = 4) -> str:
    """The table, floats to `digits` significant digits (None: as Python prints them)."""
    frame = df.reset_index() if index else df
    if isinstance(frame.columns, pd.MultiIndex):
        frame = frame.set_axis([" / ".join(str(c) for c in col if str(c))
                                for col in frame.columns], axis=1)
    header = [_cell(c, None) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for rec in frame.itertuples(index=False, name=None):
        lines.append("| " + " | ".join(_cell(v, digits) for v in rec) + " |")
    return "\n".join(lines) + "\n"
