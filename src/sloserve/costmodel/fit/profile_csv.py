"""The measured-iteration CSV format (your own hardware): reading and validating it.

A profile CSV holds whole measured iterations, e.g. the output of
:func:`sloserve.costmodel.profiler.profile_model` (``sloserve profile``);
:mod:`.profile_fit` fits them. The format, one row per measured batch (a header line, then
data lines; blank lines are skipped but counted, so errors name the right line):

Required columns (the :class:`~sloserve.costmodel.base.BatchStats` aggregates, exactly as
the simulator computes them, and the measured time)
    ``num_prefill_tokens`` (Σ prefill chunk lengths c), ``num_prefill_seqs`` (chunks),
    ``prefill_attn_work`` (Σ c·(c + ctx), ctx = tokens already cached for that sequence),
    ``num_decode`` (decode requests), ``decode_context_sum`` (Σ ctx over decode requests,
    the KV tokens cached before the step, as ``engine.instance`` counts it) and ``time_s``
    (seconds of one iteration; a median over repeats is the intended value). Counts are
    integers ≥ 0, ``time_s`` > 0; a row must have tokens; ``num_prefill_seqs`` ≥ 1 and
    ≤ ``num_prefill_tokens`` and ``prefill_attn_work`` ≥ ``num_prefill_tokens`` exactly when
    there is prefill; ``decode_context_sum`` is 0 when ``num_decode`` is.
Optional per-group times (seconds; empty cell = not measured)
    ``time_decode_attention_s`` and ``time_prefill_attention_s`` (the attention kernels and
    KV-cache writes of the decode / prefill part of the batch), ``time_comm_s``
    (tensor-parallel all-reduces) and ``time_non_attention_s`` (informational, see below).
    Each is ≥ 0 and ≤ ``time_s``; an attention cell is required (> 0) on every row of its
    kind once the column exists, and empty or 0 on rows without that kind.
Metadata columns (strings or numbers, constant over the file)
    ``device``, ``model``, ``dtype``, ``tp``, ``device_memory_gib`` and ``model_<field>`` for
    every :class:`~sloserve.core.hardware.ModelSpec` field (``model_num_layers``, …). With
    them :func:`profile_from_csv` builds a profile without being told the model and GPU.
    A file mixing two ``model`` or ``device`` values is an error. Other columns are ignored
    and listed in the report (``ignored_columns``), so a typo in a group column shows.

Every problem raises :class:`~sloserve.core.errors.ConfigError` naming file, line and column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sloserve.core.csvio import read_strict_csv
from sloserve.core.errors import ConfigError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.fit.lstsq import FloatArray

CSV_INPUT_COLUMNS: tuple[str, ...] = (
    "num_prefill_tokens",
    "num_prefill_seqs",
    "prefill_attn_work",
    "num_decode",
    "decode_context_sum",
)
"""The :class:`BatchStats` aggregates of a measured iteration (required, integers ≥ 0)."""

CSV_TIME_COLUMN = "time_s"
"""Seconds of one measured iteration (required, > 0)."""

CSV_REQUIRED_COLUMNS: tuple[str, ...] = (*CSV_INPUT_COLUMNS, CSV_TIME_COLUMN)

CSV_GROUP_COLUMNS: dict[str, str] = {
    "non_attention": "time_non_attention_s",
    "decode_attention": "time_decode_attention_s",
    "prefill_attention": "time_prefill_attention_s",
    "comm": "time_comm_s",
}
"""Optional per-group times (seconds), by group name."""

MODEL_COLUMN_PREFIX = "model_"
DEVICE_COLUMN_PREFIX = "device_"

CSV_METADATA_COLUMNS: tuple[str, ...] = (
    "device",
    "model",
    "dtype",
    "tp",
    *(DEVICE_COLUMN_PREFIX + f for f in GPUSpec.model_fields if f != "name"),
    *(MODEL_COLUMN_PREFIX + f for f in ModelSpec.model_fields if f != "name"),
)
"""Columns describing the setting; each must hold one value over the whole file."""

CSV_INFO_COLUMNS: tuple[str, ...] = ("kind", "repeats", "time_min_s", "time_max_s")
"""Informational columns the profiler writes; read by people, not by the fit."""


@dataclass(frozen=True)
class ProfileTable:
    """A validated measured-iteration table (the CSV format in the module docstring)."""

    frame: pd.DataFrame
    """One row per measured batch: the input columns (int64), ``time_s`` and the group
    columns that exist (float64, NaN where not measured)."""
    source: str
    """The file (or ``<DataFrame>``) the rows came from, for messages."""
    metadata: dict[str, Any]
    """The value of every metadata column present (constant over the file)."""
    ignored_columns: tuple[str, ...] = ()
    """Columns that are neither measured, metadata nor informational."""


class _LineMap:
    """Data row index → file line (1-based; the header and blank lines count)."""

    def __init__(self, lines: NDArray[np.int64]) -> None:
        self.lines = lines

    def __call__(self, idx: int) -> int:
        return int(self.lines[idx])


def _csv_error(source: str, line: int, column: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: line {line}, column {column}: {msg}")


def read_profile_csv(path: str | Path) -> ProfileTable:
    """Read and validate a measured-iteration CSV.

    Raises :class:`ConfigError` naming the file, line and column of the first problem.
    """
    p = Path(path)
    df, lines = read_strict_csv(p, "profile CSV", ConfigError)
    if any(c.startswith("Unnamed:") for c in df.columns):
        raise ConfigError(f"{p}: line 1: a column has no name (or a row has too many fields)")
    return validate_profile_frame(df, source=str(p), lines=lines)


def _numeric(df: pd.DataFrame, col: str, source: str, line: _LineMap, required: bool) -> FloatArray:
    raw = df[col]
    num = pd.to_numeric(raw, errors="coerce")
    bad = (num.isna() & raw.notna()).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _csv_error(source, line(i), col, f"not a number ({raw.iloc[i]!r})")
    out = num.to_numpy(dtype=np.float64)
    if required and np.isnan(out).any():
        i = int(np.flatnonzero(np.isnan(out))[0])
        raise _csv_error(source, line(i), col, "empty cell; a value is required")
    return out


def _first(mask: NDArray[np.bool_]) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def validate_profile_frame(
    df: pd.DataFrame, source: str = "<DataFrame>", lines: NDArray[np.int64] | None = None
) -> ProfileTable:
    """Validate a measured-iteration table already in memory (e.g. from the profiler).

    ``lines`` maps each row to its file line for messages; by default row ``i`` is line
    ``i + 2`` (a header line, no blank lines).
    """
    line = _LineMap(np.arange(len(df), dtype=np.int64) + 2 if lines is None else np.asarray(lines))
    cols = [str(c) for c in df.columns]
    missing = [c for c in CSV_REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise ConfigError(
            f"{source}: line 1, column(s) {', '.join(missing)}: missing; "
            f"have {', '.join(cols) or '(none)'}"
        )
    if len(df) == 0:
        raise ConfigError(f"{source}: no measured rows")

    out = pd.DataFrame(index=pd.RangeIndex(len(df)))
    ints: dict[str, NDArray[np.int64]] = {}
    for col in CSV_INPUT_COLUMNS:
        v = _numeric(df, col, source, line, required=True)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(v) | (v < 0) | (v != np.floor(v))
        if (i := _first(bad)) is not None:
            raise _csv_error(source, line(i), col, f"must be an integer >= 0 ({v[i]:g})")
        ints[col] = v.astype(np.int64)
        out[col] = ints[col]
    n_p, seqs, work = (
        ints["num_prefill_tokens"],
        ints["num_prefill_seqs"],
        ints["prefill_attn_work"],
    )
    n_d, ctx = ints["num_decode"], ints["decode_context_sum"]
    checks: list[tuple[NDArray[np.bool_], str, str]] = [
        (n_p + n_d == 0, "num_prefill_tokens", "an empty batch (no prefill and no decode tokens)"),
        ((n_p == 0) & (seqs > 0), "num_prefill_seqs", "must be 0 when num_prefill_tokens is 0"),
        ((n_p > 0) & (seqs == 0), "num_prefill_seqs", "must be >= 1 when there is prefill"),
        (seqs > n_p, "num_prefill_seqs", "more prefill chunks than prefill tokens"),
        ((n_p == 0) & (work > 0), "prefill_attn_work", "must be 0 when num_prefill_tokens is 0"),
        (
            (n_p > 0) & (work < n_p),
            "prefill_attn_work",
            "must be >= num_prefill_tokens (Σ c·(c + ctx) >= Σ c)",
        ),
        ((n_d == 0) & (ctx > 0), "decode_context_sum", "must be 0 when num_decode is 0"),
    ]
    for bad, col, msg in checks:
        if (i := _first(bad)) is not None:
            raise _csv_error(source, line(i), col, msg)

    t = _numeric(df, CSV_TIME_COLUMN, source, line, required=True)
    if (i := _first(~np.isfinite(t) | (t <= 0))) is not None:
        raise _csv_error(source, line(i), CSV_TIME_COLUMN, f"must be a finite time > 0 ({t[i]})")
    out[CSV_TIME_COLUMN] = t

    kinds = {"decode_attention": (n_d > 0, "decode"), "prefill_attention": (n_p > 0, "prefill")}
    parts = np.zeros(len(df))
    for group, col in CSV_GROUP_COLUMNS.items():
        if col not in cols:
            continue
        v = _numeric(df, col, source, line, required=False)
        present = ~np.isnan(v)
        with np.errstate(invalid="ignore"):
            bad = present & (~np.isfinite(v) | (v < 0))
        if (i := _first(bad)) is not None:
            raise _csv_error(source, line(i), col, f"must be a finite time >= 0 ({v[i]})")
        if (i := _first(present & (v > t))) is not None:
            raise _csv_error(source, line(i), col, f"larger than time_s ({v[i]} > {t[i]})")
        if group in kinds:
            has, what = kinds[group]
            if (i := _first(has & ~(v > 0))) is not None:
                raise _csv_error(
                    source,
                    line(i),
                    col,
                    f"must be > 0 on a row with {what} ({'empty' if np.isnan(v[i]) else v[i]})",
                )
            if (i := _first(~has & present & (v != 0))) is not None:
                raise _csv_error(
                    source, line(i), col, f"must be empty or 0 on a row without {what}"
                )
        if group != "non_attention":
            parts += np.nan_to_num(v)
        out[col] = v
    if (i := _first(parts >= t)) is not None:
        raise _csv_error(
            source,
            line(i),
            CSV_TIME_COLUMN,
            f"not larger than the sum of the attention and comm times ({t[i]} <= {parts[i]:g})",
        )

    metadata: dict[str, Any] = {}
    for col in CSV_METADATA_COLUMNS:
        if col not in cols:
            continue
        vals = df[col]
        keep = vals.notna() & (vals.astype(str).str.strip() != "")
        if not keep.any():
            continue
        text = vals.astype(str).str.strip()
        first = int(np.flatnonzero(keep.to_numpy())[0])
        ref = text.iloc[first]
        if (i := _first((keep & (text != ref)).to_numpy())) is not None:
            raise _csv_error(
                source,
                line(i),
                col,
                f"one profile describes one setting: {text.iloc[i]!r} here, "
                f"{ref!r} on line {line(first)}",
            )
        metadata[col] = vals.iloc[first]
    known = {*CSV_REQUIRED_COLUMNS, *CSV_GROUP_COLUMNS.values(), *CSV_METADATA_COLUMNS}
    known.update(CSV_INFO_COLUMNS)
    ignored = tuple(c for c in cols if c not in known)
    return ProfileTable(out, source, metadata, ignored)
