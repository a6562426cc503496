"""Finite bounds for every number a user can give, declared once.

Each bounded quantity is an annotated type (``Rate``, ``Seconds``, ``Count`` …) carrying
pydantic constraints: a config field typed with it refuses NaN, ±inf and values beyond the
bound with one message, the CLI derives its ``--help`` suffix from the same constraints
(:func:`constraint_text`), and trace columns and ``name:NUMBER`` specs are checked against
them (:func:`check_value`, :func:`first_violation`). Change a bound here and the error, the
check and the help text change together.

The bounds are far beyond any real run but small enough that numpy, int64 and memory hold
what they imply: at most 1e6 requests/s, 1e7 s (~116 days) of simulated time, 1e8
requests, 1e7 tokens per request, seeds that fit an unsigned 63-bit integer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar, get_args

import annotated_types as at
import numpy as np
from numpy.typing import NDArray
from pydantic import Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from sloserve.core.errors import ConfigError, plain_message

_T = TypeVar("_T")

MAX_RATE = 1e6
"""Requests (or tokens) per second."""
MIN_RATE = 1e-6
MAX_SECONDS = 1e7
"""Any time or duration: ~116 days of simulated time."""
MIN_SECONDS = 1e-6
"""The shortest positive duration (1 µs): 1/x stays finite."""
MAX_COUNT = 100_000_000
"""Requests, batches, replicas, iterations."""
MAX_TOKENS = 10_000_000
"""Tokens of one request, a context window, a batch."""
MAX_SEED = 2**63 - 1
MAX_PRIORITY = 2**31 - 1
MAX_FACTOR = 1e6
"""Dimensionless multipliers (speed-up, burst intensity, coefficient of variation)."""
MAX_GIB = 1e6
MAX_BANDWIDTH = 1e6
"""GB/s of any link (disk, PCIe, NVLink, network)."""

Rate = Annotated[float, Field(ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False)]
"""Requests per second."""
TokenRate = Annotated[float, Field(ge=1e-3, le=MAX_RATE, allow_inf_nan=False)]
"""Tokens per second (reading speeds, prefill speeds)."""
Seconds = Annotated[float, Field(ge=MIN_SECONDS, le=MAX_SECONDS, allow_inf_nan=False)]
"""A positive duration or target."""
Time = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A point in time, or a duration that may be 0."""
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
"""A number of things, at least one."""
Index = Annotated[int, Field(ge=0, le=MAX_COUNT)]
"""A position or a count that may be 0."""
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
"""A number of tokens, at least one."""
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Priority = Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
"""A share in (0, 1]."""
UnitInterval = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
"""A share in [0, 1]."""
Factor = Annotated[float, Field(ge=1e-6, le=MAX_FACTOR, allow_inf_nan=False)]
"""A positive dimensionless multiplier."""
Weight = Annotated[float, Field(ge=0, le=MAX_FACTOR, allow_inf_nan=False)]
"""A non-negative relative weight."""
GiB = Annotated[float, Field(ge=0, le=MAX_GIB, allow_inf_nan=False)]
Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
Temperature = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
"""A sampling temperature (0: greedy)."""
Workers = Annotated[int, Field(ge=1, le=1024)]
"""Worker processes or solver threads."""
Degree = Annotated[int, Field(ge=1, le=1024)]
"""A tensor-parallel degree (GPUs of one replica)."""
ReplicaCount = Annotated[int, Field(ge=1, le=65_536)]
"""Replicas of a cluster (or of one replica group)."""
Millis = Annotated[float, Field(ge=1e-3, le=MAX_SECONDS * 1e3, allow_inf_nan=False)]
"""A positive duration or target in milliseconds."""


def _num(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**6:
        return f"{v:.3g}" if v != MAX_SEED else "2**63-1"
    if isinstance(v, float) and v.is_integer() and abs(v) < 10**6:
        return str(int(v))
    return f"{v:g}"


def constraints(info: FieldInfo | Sequence[Any]) -> tuple[str | None, str | None]:
    """The lower and upper bound of a field as text (``'0 <'``, ``'≤ 1e+06'``), or None."""
    meta = list(info.metadata) if isinstance(info, FieldInfo) else list(info)
    if isinstance(info, FieldInfo) and not meta:
        # ``Seconds | None``: the constraints sit on the Annotated member of the union
        for arg in get_args(info.annotation):
            meta += [
                c for m in getattr(arg, "__metadata__", ()) for c in getattr(m, "metadata", [m])
            ]
    low = high = None
    for m in meta:
        if isinstance(m, at.Gt):
            low = f"{_num(m.gt)} <"
        elif isinstance(m, at.Ge):
            low = f"{_num(m.ge)} ≤"
        elif isinstance(m, at.Lt):
            high = f"< {_num(m.lt)}"
        elif isinstance(m, at.Le):
            high = f"≤ {_num(m.le)}"
        elif isinstance(m, at.Interval):
            lo, hi = constraints(list(at.Interval(**vars(m))))
            low, high = lo or low, hi or high
    return low, high


def constraint_text(info: FieldInfo | Sequence[Any]) -> str:
    """``'[0 < x ≤ 1e+06]'`` for a field's constraints ('' when it has none)."""
    low, high = constraints(info)
    if low is None and high is None:
        return ""
    return "[" + " ".join(p for p in (low, "x", high) if p) + "]"


def check_value(kind: Any, value: _T, what: str) -> _T:
    """``value`` validated as the annotated type ``kind``; a ConfigError naming ``what``."""
    try:
        out: _T = TypeAdapter(kind).validate_python(value)
        return out
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{what}: {plain_message(err)} (got {value!r})") from None


def _limits(kind: Any) -> tuple[float, bool, float, bool]:
    lo, lo_open, hi, hi_open = -math.inf, False, math.inf, False
    for m in getattr(kind, "__metadata__", ()):
        for c in m.metadata if isinstance(m, FieldInfo) else [m]:
            if isinstance(c, at.Gt):
                lo, lo_open = float(c.gt), True  # type: ignore[arg-type]
            elif isinstance(c, at.Ge):
                lo = float(c.ge)  # type: ignore[arg-type]
            elif isinstance(c, at.Lt):
                hi, hi_open = float(c.lt), True  # type: ignore[arg-type]
            elif isinstance(c, at.Le):
                hi = float(c.le)  # type: ignore[arg-type]
    return lo, lo_open, hi, hi_open


def bound_text(kind: Any) -> str:
    """The constraint text of an annotated type (``Rate`` → ``'[1e-06 ≤ x ≤ 1e+06]'``)."""
    metas = [c for m in getattr(kind, "__metadata__", ()) for c in getattr(m, "metadata", [m])]
    return constraint_text(metas)


def first_violation(kind: Any, values: NDArray[np.float64]) -> int | None:
    """Index of the first value outside the annotated type ``kind`` (NaN and ±inf are
    outside; integer types also need whole numbers), or None."""
    lo, lo_open, hi, hi_open = _limits(kind)
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(v)
        bad |= (v <= lo) if lo_open else (v < lo)
        bad |= (v >= hi) if hi_open else (v > hi)
        if getattr(kind, "__origin__", None) is int:
            bad |= v != np.floor(v)
    idx = np.flatnonzero(bad)
    return int(idx[0]) if idx.size else None
