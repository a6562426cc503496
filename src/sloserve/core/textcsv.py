"""A CSV's cells as text columns, without pandas when the file is plain.

:func:`read_text_columns` gives what :func:`~sloserve.core.csvio.read_strict_csv` gives
(every cell as text, ``None`` for an empty one, blank lines dropped but counted, each
row's line in the file) as ``name -> list`` instead of a DataFrame. A *plain* file (UTF-8
without BOM; no quotes, NUL, or whitespace other than the line breaks "\\n"; unique
non-empty header names; every line blank or exactly as many fields as the header) is split
by hand, which saves importing pandas (~0.2 s) and its parser; anything else goes through
``read_strict_csv``, so that every shape problem keeps its one message. On a plain file
both give the same cells: pandas' reader keeps text verbatim under ``dtype=str``.

:func:`to_floats` is ``pd.to_numeric(cells, errors="coerce")`` for such columns: plain
decimal numbers by Python's ``float`` (correctly rounded, as pandas' conversion is: the
same doubles), anything else by pandas itself.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from sloserve.core.errors import SloserveError

TextColumns = dict[str, list[str | None]]
"""Column name -> one cell per non-blank row (``None``: an empty cell)."""

# Anything pandas' reader treats specially, or strips from a header name (read_strict_csv
# strips names, skips initial spaces): quotes, NUL, a BOM, any whitespace but "\n" (space,
# tab, "\r", NBSP, "\x0b", "\x0c", ...).
_UNPLAIN = re.compile(r'["\ufeff\x00]|[^\S\n]')
_BLANK_LINE = re.compile(r"^,*$", re.MULTILINE)  # empty, or only empty cells
# Plain decimals only (no inf/nan words, no "+", no "_", integers of at most 15 digits):
# the cells where float() and pandas' conversion are checked to agree.
_NUMBER = r"-?(?:\d+\.\d*|\.\d+|\d{1,15})(?:[eE][+-]?\d{1,3})?"
_PLAIN_NUMBER = re.compile(_NUMBER)
_PLAIN_COLUMN = re.compile(rf"(?:{_NUMBER})?(?:\n(?:{_NUMBER})?)*")


def _plain_csv(path: Path) -> tuple[TextColumns, NDArray[np.int64]] | None:
    """The columns of a plain file, or None when ``read_strict_csv`` must read it."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # read_strict_csv raises the typed error
    if _UNPLAIN.search(text):
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it is no blank line
    if len(lines) < 2 or not lines[0]:
        return None
    header = lines[0].split(",")
    width = len(header)
    if "" in header or len(set(header)) != width or any(h != h.strip() for h in header):
        return None  # pandas names (Unnamed: k) or renames (a.1) those; strips names
    body = lines[1:]
    # The common case, every line a row of ``width`` cells: one split for the whole file.
    # (The final newline is left out of the search: "^" matches after it.)
    end = len(text) - 1 if text.endswith("\n") else len(text)
    commas = set(map(str.count, body, repeat(",", len(body))))
    if body and commas == {width - 1} and not _BLANK_LINE.search(text, 0, end):
        flat = ",".join(body).split(",")
        cols: TextColumns = {
            name: [c or None for c in flat[j::width]] for j, name in enumerate(header)
        }
        return cols, np.arange(2, len(body) + 2, dtype=np.int64)
    rows: list[list[str]] = []
    line_no: list[int] = []
    for k in range(1, len(lines)):
        fields = lines[k].split(",")
        if len(fields) != width:
            if fields == [""]:
                continue  # a blank line: counted (k), never a row
            return None
        if not any(fields):
            continue  # every cell empty: blank, as pandas' all-NaN row
        rows.append(fields)
        line_no.append(k + 1)
    if not rows:
        return None
    cols = {}
    for j, name in enumerate(header):
        cols[name] = [r[j] or None for r in rows]
    return cols, np.asarray(line_no, dtype=np.int64)


def _repeated_name(path: Path) -> str | None:
    """The first header name that occurs twice (names stripped, as pandas' reading strips
    them; empty names left to pandas, which calls them ``Unnamed: k``), or None."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        header = next(csv.reader(f, skipinitialspace=True), [])
    seen: set[str] = set()
    for name in (h.strip() for h in header):
        if name in seen:
            return name
        if name:
            seen.add(name)
    return None


def read_text_columns(
    path: str | Path, what: str, error: type[SloserveError]
) -> tuple[TextColumns, NDArray[np.int64]]:
    """The non-blank rows of ``path`` as text columns, and each row's 1-based line.

    The same cells, lines and errors as :func:`~sloserve.core.csvio.read_strict_csv`
    (``what`` names the file in messages, problems raise ``error``)."""
    p = Path(path)
    plain = _plain_csv(p)
    if plain is not None:
        return plain
    from sloserve.core.csvio import read_strict_csv

    df, lines = read_strict_csv(p, what, error)
    twice = _repeated_name(p)
    if twice is not None:  # pandas would rename the second one "<name>.1"
        raise error(f"{p}: column {twice} appears more than once in the header")
    cols: TextColumns = {}
    for c in df.columns:
        cols[c] = [v if isinstance(v, str) else None for v in df[c].tolist()]
    return cols, lines


def to_floats(cells: Sequence[str | None]) -> NDArray[np.float64]:
    """``pd.to_numeric(cells, errors="coerce")`` as float64: NaN for an empty cell or one
    that is no number."""
    if not any(cells):  # an optional column left empty
        return np.full(len(cells), np.nan)
    # One regex pass over the whole column decides; then one float() per cell in C.
    joined = "\n".join([c or "" for c in cells])
    if joined.count("\n") == len(cells) - 1 and _PLAIN_COLUMN.fullmatch(joined):
        return np.array(list(map(float, [c or "nan" for c in cells])), dtype=np.float64)
    out = np.empty(len(cells), dtype=np.float64)
    odd: list[int] = []
    for i, c in enumerate(cells):
        if c is None:
            out[i] = np.nan
        elif _PLAIN_NUMBER.fullmatch(c):
            out[i] = float(c)
        else:
            odd.append(i)
    if odd:
        import pandas as pd

        raw = pd.Series([cells[i] for i in odd], dtype=str)
        out[odd] = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    return out
