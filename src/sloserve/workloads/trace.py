"""Replaying a request trace CSV exactly as given.

Columns: ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (required) and optionally
``class`` (rt|be), ``priority``, ``model``, ``ttft_slo_s``, ``tpot_slo_s``, ``deadline_s``.
An empty optional cell falls back to the workload's per-class rule. Any problem raises
:class:`~sloserve.core.errors.WorkloadError` naming the file, the line and the column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sloserve.core.bounds import (
    Priority,
    Seconds,
    Time,
    TokenRate,
    Tokens,
    bound_text,
    first_violation,
)
from sloserve.core.errors import WorkloadError
from sloserve.core.textcsv import Cells, cell, present, read_text_columns, texts, to_floats

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_FLOAT = ("ttft_slo_s", "tpot_slo_s", "deadline_s", "qoe_ttft_s", "qoe_tokens_per_s")
COLUMN_BOUNDS: dict[str, Any] = {
    "arrival_s": Time,
    "prompt_tokens": Tokens,
    "output_tokens": Tokens,
    "priority": Priority,
    "ttft_slo_s": Seconds,
    "tpot_slo_s": Seconds,
    "deadline_s": Seconds,
    "qoe_ttft_s": Time,
    "qoe_tokens_per_s": TokenRate,
}
"""The bounds of every numeric trace column (the same types as the config fields)."""
# An empty optional cell (NaN) falls back to the class rule; checked as an in-bounds value.
_FILL = {
    "ttft_slo_s": 1.0,
    "tpot_slo_s": 1.0,
    "deadline_s": 1.0,
    "qoe_ttft_s": 1.0,
    "qoe_tokens_per_s": 1.0,
}


@dataclass
class TraceColumns:
    """A validated trace, column by column."""

    arrival: NDArray[np.float64]
    prompt: NDArray[np.int64]
    output: NDArray[np.int64]
    req_class: list[str] | None
    priority: NDArray[np.float64] | None
    """Integer priorities; NaN where the cell was empty."""
    model: list[str] | None
    slo: dict[str, NDArray[np.float64]]


class _Lines:
    """Maps data rows to file lines (1-based; the header and blank lines count)."""

    def __init__(self, lines: NDArray[np.int64]) -> None:
        self.lines = lines

    def __call__(self, idx: int) -> int:
        return int(self.lines[idx])


def _numeric(df: dict[str, Cells], col: str, path: Path, _line: _Lines) -> NDArray[np.float64]:
    raw = df[col]
    num = to_floats(raw)
    bad = np.isnan(num) & present(raw)
    if col in REQUIRED:
        bad |= np.isnan(num)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise WorkloadError(
            f"{path}: line {_line(i)}, column {col}: not a number ({_cell(cell(raw, i))!r})"
        )
    return num


def _cell(v: str | None) -> str | float:
    """A cell as pandas showed it: an empty one is NaN."""
    return v if v is not None else float("nan")


def read_trace(path: str | Path) -> TraceColumns:
    p = Path(path)
    df, lines = read_text_columns(p, "trace file", WorkloadError)
    _line = _Lines(lines)
    extra = [c for c in df if c.startswith("Unnamed:")]
    if extra:
        raise WorkloadError(f"{p}: a row has more fields than the header, or a column has no name")
    missing = [c for c in REQUIRED if c not in df]
    if missing:
        raise WorkloadError(f"{p}: missing column(s) {', '.join(missing)}; have {', '.join(df)}")
    if len(lines) == 0:
        raise WorkloadError(f"{p}: the trace has no rows")
    arrival = _numeric(df, "arrival_s", p, _line)
    i = first_violation(Time, arrival)
    if i is not None:
        raise WorkloadError(
            f"{p}: line {_line(i)}, column arrival_s: must be a time in seconds "
            f"{bound_text(Time)} ({_cell(cell(df['arrival_s'], i))})"
        )
    dec = np.flatnonzero(np.diff(arrival) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        raise WorkloadError(
            f"{p}: line {_line(i)}, column arrival_s: not sorted "
            f"({arrival[i]} after {arrival[i - 1]})"
        )
    ints: dict[str, NDArray[np.int64]] = {}
    for col in ("prompt_tokens", "output_tokens"):
        v = _numeric(df, col, p, _line)
        i = first_violation(Tokens, v)
        if i is not None:
            raise WorkloadError(
                f"{p}: line {_line(i)}, column {col}: must be an integer number of tokens "
                f"{bound_text(Tokens)} ({_cell(cell(df[col], i))})"
            )
        ints[col] = v.astype(np.int64)
    req_class = None
    if "class" in df:
        cls = [(v if v is not None else "rt").strip().lower() for v in texts(df["class"])]
        bad_cls = [k for k, v in enumerate(cls) if v != "rt" and v != "be"]
        if bad_cls:
            i = bad_cls[0]
            raise WorkloadError(
                f"{p}: line {_line(i)}, column class: must be rt or be ({cls[i]!r})"
            )
        req_class = cls
    priority = None
    if "priority" in df:
        pr = _numeric(df, "priority", p, _line)
        i = first_violation(Priority, np.where(np.isnan(pr), 0.0, pr))
        if i is not None:
            raise WorkloadError(
                f"{p}: line {_line(i)}, column priority: must be an integer "
                f"{bound_text(Priority)} ({_cell(cell(df['priority'], i))})"
            )
        priority = pr  # NaN (an empty cell) falls back to the class rule
    model = (
        [v if v is not None else "default" for v in texts(df["model"])] if "model" in df else None
    )
    slo: dict[str, NDArray[np.float64]] = {}
    for col in OPTIONAL_FLOAT:
        if col in df:
            v = _numeric(df, col, p, _line)
            kind = COLUMN_BOUNDS[col]
            i = first_violation(kind, np.where(np.isnan(v), _FILL[col], v))
            if i is not None:
                raise WorkloadError(
                    f"{p}: line {_line(i)}, column {col}: must be {bound_text(kind)} "
                    f"({_cell(cell(df[col], i))})"
                )
            slo[col] = v
    return TraceColumns(
        arrival, ints["prompt_tokens"], ints["output_tokens"], req_class, priority, model, slo
    )
