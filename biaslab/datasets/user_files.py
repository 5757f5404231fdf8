"""Reading a file the user points at: every way it can fail is one line naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

# pandas is imported inside the functions that use it: it costs ~0.5 s at the start of every
# `biaslab` command (the protocols' graphs import this module to register them).
if TYPE_CHECKING:
    import pandas as pd

from biaslab.errors import UserError

__all__ = ["read_user_csv", "read_label_csv", "BIASED_WORDS", "NOT_BIASED_WORDS"]


def read_user_csv(path: str | Path, what: str) -> pd.DataFrame:
    """A CSV as strings (no NaN guessing), or a `UserError` saying which `what` failed."""
    import pandas as pd

    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except (OSError, EOFError, UnicodeDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as exc:  # EOFError: a truncated .gz
        raise UserError(f"cannot read {what} {path}: {exc}") from None


BIASED_WORDS = frozenset({"biased", "yes", "y", "true", "1"})
NOT_BIASED_WORDS = frozenset({"fair", "unbiased", "not biased", "no", "n", "false", "0"})


def read_label_csv(path: str | Path, what: str, columns: Sequence[str], *,
                   integers: Sequence[str] = (), blank_ok: bool = False) -> pd.DataFrame:
    """A CSV of human labels: every column as text, those in `integers` as int, and ``label``
    as True (biased: biased/yes/true/1), False (fair/unbiased/no/false/0) or, where `blank_ok`,
    None for an empty cell. Each protocol says which other `columns` it needs.

    Raises:
        UserError: unreadable file, a missing column, a label outside both word lists, or a
            non-integer in an integer column; one line naming the file.
    """
    frame = read_user_csv(path, what)
    needed = (*columns, "label")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise UserError(f"{what} {path}: missing column '{missing[0]}' (needs "
                        f"{', '.join(needed)})")
    words = frame["label"].str.strip().str.lower()
    known = words.isin(BIASED_WORDS | NOT_BIASED_WORDS) | ((words == "") & blank_ok)
    if not known.all():
        raise UserError(f"{what} {path}: label {frame.loc[~known, 'label'].iloc[0]!r} is not "
                        "yes/no (biased/fair, 1/0, true/false)")
    frame["label"] = [True if w in BIASED_WORDS else False if w in NOT_BIASED_WORDS else None
                      for w in words]
    for column in integers:
        try:
            frame[column] = frame[column].astype(int)
        except ValueError:
            raise UserError(f"{what} {path}: '{column}' must be an integer") from None
    return frame
