"""Strict CSV reading shared by trace loaders and profile fitting.

Every cell is read as text (callers convert and validate columns, naming the line and
column of a bad cell), blank lines are dropped but still counted, and any shape problem is
the caller's typed error naming the file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from sloserve.core.errors import SloserveError

if TYPE_CHECKING:  # pandas is imported when a CSV is read (start-up time)
    import pandas as pd


def read_strict_csv(
    path: str | Path, what: str, error: type[SloserveError]
) -> tuple[pd.DataFrame, NDArray[np.int64]]:
    """The non-blank rows of ``path`` as text, and each row's 1-based line in the file.

    ``what`` names the file in messages ("trace file", "profile CSV"); problems raise
    ``error``. Column names are stripped; unnamed columns (a row with more fields than the
    header) are left for the caller to report in its own terms.
    """
    import pandas as pd

    p = Path(path)
    try:
        with warnings.catch_warnings():
            # pandas only warns when a row has more fields than the header; that is an error.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(
                p,
                dtype=str,
                keep_default_na=False,
                na_values=[""],
                skipinitialspace=True,
                skip_blank_lines=False,
                index_col=False,  # an extra field must not turn the first column into an index
            )
    except pd.errors.ParserWarning:
        raise error(f"{p}: a row has more fields than the header") from None
    except FileNotFoundError:
        raise error(f"{p}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{p}: is a directory, not a {what}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise error(f"{p}: not a readable CSV ({str(e).splitlines()[0]})") from e
    df.columns = [str(c).strip() for c in df.columns]
    # Blank lines are skipped, but still counted so that errors name the right line.
    blank = df.isna().all(axis=1).to_numpy()
    lines = np.flatnonzero(~blank).astype(np.int64) + 2
    return df[~blank].reset_index(drop=True), lines
