"""Reading a file the user points at: every way it can fail is one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from biaslab.errors import UserError

__all__ = ["read_user_csv"]


def read_user_csv(path: str | Path, what: str) -> pd.DataFrame:
    """A CSV as strings (no NaN guessing), or a `UserError` saying which `what` failed."""
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except (OSError, EOFError, UnicodeDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as exc:  # EOFError: a truncated .gz
        raise UserError(f"cannot read {what} {path}: {exc}") from None
