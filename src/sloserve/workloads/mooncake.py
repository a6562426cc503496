"""Mooncake-style JSONL traces: one request per line.

The format of the traces released with the Mooncake paper (Qin et al., "Mooncake: Trading
More Storage for Less Computation", FAST '25; kvcache-ai/Mooncake,
``FAST25-release/traces/``, Apache-2.0)::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}

* ``timestamp``: arrival time in **milliseconds** (any origin; replayed from the first);
* ``input_length`` / ``output_length``: prompt and output tokens (integers >= 1);
* ``hash_ids`` (optional): one non-negative id per 512-token block of the prompt; equal ids
  mean identical prefix blocks (reusable KV cache). A request has at most
  ``ceil(input_length / 512)`` blocks. They are kept on each request
  (:attr:`Request.hash_ids`): the prompt identity prefix caching matches
  (``engine/prefix_cache.py``).

Every problem raises :class:`~sloserve.core.errors.WorkloadError` naming the file and line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from sloserve.core.errors import WorkloadError
from sloserve.workloads.loaders import TraceTable, order_arrivals

BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in Mooncake's traces."""
REQUIRED_FIELDS = ("timestamp", "input_length", "output_length")


def _int_field(p: Path, line: int, obj: dict[str, object], key: str, low: int) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise WorkloadError(f"{p}: line {line}, field {key}: not a number ({v!r})")
    if v != int(v) or v < low:
        raise WorkloadError(f"{p}: line {line}, field {key}: must be an integer >= {low} ({v})")
    return int(v)


def load_mooncake(path: str | Path, *, strict: bool = True) -> TraceTable:
    """A Mooncake JSONL trace as a :class:`~sloserve.workloads.loaders.TraceTable`.

    Arrivals must not decrease (equal timestamps are fine); with ``strict=False`` they are
    sorted and a note says so. The table has a ``hash_ids`` column (tuples; ``None`` where a
    line has none) when any line has them.
    """
    import pandas as pd

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{p}: trace file not found") from None
    except IsADirectoryError:
        raise WorkloadError(f"{p}: is a directory, not a trace file") from None
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{p}: not a UTF-8 text file ({e.reason})") from None
    ts: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    hashes: list[tuple[int, ...] | None] = []
    lines: list[int] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{p}: line {no}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{p}: line {no}: expected a JSON object")
        missing = [k for k in REQUIRED_FIELDS if k not in obj]
        if missing:
            raise WorkloadError(f"{p}: line {no}: missing field(s) {', '.join(missing)}")
        t = obj["timestamp"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise WorkloadError(
                f"{p}: line {no}, field timestamp: must be a number of ms >= 0 ({t!r})"
            )
        n_in = _int_field(p, no, obj, "input_length", 1)
        n_out = _int_field(p, no, obj, "output_length", 1)
        h = obj.get("hash_ids")
        if h is not None:
            if not isinstance(h, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in h
            ):
                what = "not" if not isinstance(h, list) else "holds"
                bad = (
                    h
                    if not isinstance(h, list)
                    else next(x for x in h if not isinstance(x, int) or isinstance(x, bool))
                )
                shown = json.dumps(bad)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise WorkloadError(
                    f"{p}: line {no}, field hash_ids: must be a list of integers ({what} {shown})"
                )
            neg = next((x for x in h if x < 0), None)
            if neg is not None:  # Python hashes -1 and -2 alike: two ids, one cache key
                raise WorkloadError(f"{p}: line {no}, field hash_ids: {neg} is negative")
            most = math.ceil(n_in / BLOCK_TOKENS)
            if len(h) > most:
                raise WorkloadError(
                    f"{p}: line {no}, field hash_ids: {len(h)} blocks, but input_length "
                    f"{n_in} fills at most {most} blocks of {BLOCK_TOKENS} tokens"
                )
            hashes.append(tuple(h))
        else:
            hashes.append(None)
        ts.append(float(t))
        prompt.append(n_in)
        output.append(n_out)
        lines.append(no)
    if not ts:
        raise WorkloadError(f"{p}: the trace has no rows")
    arrival = np.asarray(ts, dtype=np.float64) / 1000.0
    df = pd.DataFrame(
        {
            "arrival_s": arrival - arrival[0],
            "prompt_tokens": np.asarray(prompt, dtype=np.int64),
            "output_tokens": np.asarray(output, dtype=np.int64),
        }
    )
    if any(h is not None for h in hashes):
        df["hash_ids"] = pd.Series(hashes, dtype=object)
    t_table = TraceTable(df, f"mooncake:{p.name}")
    return order_arrivals(t_table, p, np.asarray(lines), strict, "timestamp")
