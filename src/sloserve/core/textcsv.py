"""A CSV's cells as text columns, without pandas when the file is plain.

:func:`read_text_columns` gives what :func:`~sloserve.core.csvio.read_strict_csv` gives
(every cell as text, ``None`` for an empty one, blank lines dropped but counted, each
row's line in the file) as ``name -> list`` instead of a DataFrame. A *plain* file (UTF-8
without BOM; no quotes, NUL, or whitespace other than the line breaks "\\n"; unique
non-empty header names; every line blank or exactly as many fields as the header) is split
by hand, which saves importing pandas (~0.2 s) and its parser; anything else goes through
``read_strict_csv``, so that every shape problem keeps its one message. On a plain file
both give the same cells: pandas' reader keeps text verbatim under ``dtype=str``.

Only a file of at most :data:`TEXT_PATH_MAX_BYTES` (3 MB) is split by hand: the split makes
a Python str per cell, which pays where start-up matters (pandas' import is ~0.2 s) but
costs time and memory on a large file, where pandas' C reader and its compact text columns
win. Measured (``read_trace`` in a fresh process, pandas' import included; the 16,384-row
Azure conversation trace repeated to each size, 11 columns; load average 1.6-2.0):
0.7 MB 0.075 s / 0.06 GB by hand, 0.27-0.29 s / 0.14 GB by pandas; 2 MB 0.22-0.25 s vs
0.34-0.37 s; 3 MB 0.37 s vs 0.40-0.44 s; 4 MB 0.52 s / 0.16 GB vs 0.47-0.48 s / 0.16 GB;
8 MB 1.05 s / 0.27 GB vs 0.71-0.77 s / 0.21 GB; 79 MB 10.1-10.2 s / 2.04 GB vs
5.85-5.88 s / 0.82 GB. The crossover lies between 3 and 4 MB.

The split is ``str.split``, not the stdlib ``csv`` module: on a plain file both give the
same cells, but ``csv.reader`` plus a transpose took 34.0-36.3 ms for the 16,384-row trace
against 26.9-29.3 ms for the split (CPU, best and median of 15, same load), and the file
being plain rules out everything ``csv`` would handle (quotes, escapes, other line ends).

:func:`to_floats` is ``pd.to_numeric(cells, errors="coerce")`` for such columns: plain
decimal numbers by Python's ``float`` (correctly rounded, as pandas' conversion is: the
same doubles), anything else by pandas itself.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from itertools import repeat
from operator import is_not
from pathlib import Path
from typing import TYPE_CHECKING, Union, cast

import numpy as np
from numpy.typing import NDArray

from sloserve.core.errors import SloserveError

if TYPE_CHECKING:  # pandas is imported when a file is read through it (start-up time)
    import pandas as pd

TextCells = list[str | None]
"""A column's cells (``None``: an empty cell)."""
Cells = Union[TextCells, "pd.Series[str]"]
"""A column's cells as read: a list (a plain file) or pandas' text column (anything else;
an empty cell is missing there). :func:`to_floats`, :func:`present`, :func:`texts` and
:func:`cell` read either."""
TextColumns = dict[str, TextCells]
"""Column name -> one cell per non-blank row."""

TEXT_PATH_MAX_BYTES = 3_000_000
"""The largest file split without pandas (see the module's docstring)."""

# Every character str.isspace() holds but "\n" (one character class: "[^\S\n]" in an
# alternation made the search 4x slower, 9.5 ms instead of 2.2 ms on the benchmark trace).
_SPACES = "\t\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# Anything pandas' reader treats specially, or strips from a header name (read_strict_csv
# strips names, skips initial spaces): quotes, NUL, a BOM, any whitespace but "\n" (space,
# tab, "\r", NBSP, "\x0b", "\x0c", ...).
_UNPLAIN = re.compile(f'["\\ufeff\\x00{_SPACES}]')
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
) -> tuple[dict[str, Cells], NDArray[np.int64]]:
    """The non-blank rows of ``path`` as text columns, and each row's 1-based line.

    The same cells, lines and errors as :func:`~sloserve.core.csvio.read_strict_csv`
    (``what`` names the file in messages, problems raise ``error``); a header naming a
    column twice is an error too (pandas would rename the second one ``<name>.1``). A plain
    file of at most :data:`TEXT_PATH_MAX_BYTES` gives lists, anything else pandas' own
    columns (no Python object per cell: a large trace keeps pandas' memory and speed)."""
    p = Path(path)
    try:
        small = p.stat().st_size <= TEXT_PATH_MAX_BYTES
    except OSError:
        small = False  # read_strict_csv raises the typed error
    plain = _plain_csv(p) if small else None
    if plain is not None:
        return dict(plain[0]), plain[1]
    from sloserve.core.csvio import read_strict_csv

    df, lines = read_strict_csv(p, what, error)
    twice = _repeated_name(p)
    if twice is not None:  # pandas would rename the second one "<name>.1"
        raise error(f"{p}: column {twice} appears more than once in the header")
    return {str(c): df[c] for c in df.columns}, lines


def present(cells: Cells) -> NDArray[np.bool_]:
    """Which cells are not empty."""
    if isinstance(cells, list):  # (map in C: no generator frame per cell)
        return np.fromiter(map(is_not, cells, repeat(None)), dtype=bool, count=len(cells))
    return cells.notna().to_numpy(dtype=bool)


def texts(cells: Cells) -> TextCells:
    """The cells as a list (``None``: an empty cell)."""
    if isinstance(cells, list):
        return cells
    return [c if isinstance(c, str) else None for c in cells.tolist()]


def cell(cells: Cells, i: int) -> str | None:
    """The ``i``-th cell (``None``: empty)."""
    c = cells[i] if isinstance(cells, list) else cells.iloc[i]
    return c if isinstance(c, str) else None


def to_floats(cells: Sequence[str | None] | pd.Series[str]) -> NDArray[np.float64]:
    """``pd.to_numeric(cells, errors="coerce")`` as float64: NaN for an empty cell or one
    that is no number."""
    if not isinstance(cells, Sequence):  # pandas' own column: pandas converts it
        import pandas as pd

        num = pd.to_numeric(cells, errors="coerce")
        return np.asarray(num.to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)
    if not any(cells):  # an optional column left empty
        return np.full(len(cells), np.nan)
    # One regex pass over the whole column decides; then one float() per cell in C.
    # (the common case, every cell filled, skips making the filled copies)
    full = None not in cells and "" not in cells
    joined = "\n".join(cast("Sequence[str]", cells) if full else [c or "" for c in cells])
    if joined.count("\n") == len(cells) - 1 and _PLAIN_COLUMN.fullmatch(joined):
        texts = cast("Sequence[str]", cells) if full else [c or "nan" for c in cells]
        return np.fromiter(map(float, texts), dtype=np.float64, count=len(cells))
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
