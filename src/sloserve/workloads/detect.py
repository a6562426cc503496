"""Which trace format a file is, from its header (CSV) or first line (JSONL).

Used when no format is given (``trace_format: auto``, the default; ``--trace`` without
``--trace-format``). Each known format is recognised by columns no other format has:

* ``sloserve``: a CSV header naming ``arrival_s``, ``prompt_tokens`` or ``output_tokens``;
* ``azure``: ``TIMESTAMP``, ``ContextTokens`` or ``GeneratedTokens``;
* ``burstgpt``: ``Request tokens`` or ``Response tokens``;
* ``mooncake``: a first line that is a JSON object with ``input_length`` or ``output_length``;
* ``sharegpt``: a JSON list (of conversations).

One distinguishing column is enough, so that a file with a typo in another column still
gets the format's own error ("missing column ...") rather than a vague one. Anything else
raises :class:`~sloserve.core.errors.WorkloadError` listing the formats and the flag.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from sloserve.core.errors import WorkloadError

_CSV_SIGNATURES: tuple[tuple[str, frozenset[str]], ...] = (
    ("sloserve", frozenset({"arrival_s", "prompt_tokens", "output_tokens"})),
    ("azure", frozenset({"TIMESTAMP", "ContextTokens", "GeneratedTokens"})),
    ("burstgpt", frozenset({"Request tokens", "Response tokens"})),
)
KNOWN = (
    "sloserve (CSV: arrival_s,prompt_tokens,output_tokens)",
    "azure (CSV: TIMESTAMP,ContextTokens,GeneratedTokens)",
    "burstgpt (CSV: Timestamp,Model,Request tokens,Response tokens,...,Log Type)",
    "mooncake (JSONL: timestamp,input_length,output_length[,hash_ids])",
    "sharegpt (JSON list of conversations)",
)


def _unknown(path: Path, what: str) -> WorkloadError:
    return WorkloadError(
        f"{path}: {what} matches no known trace format; known: {'; '.join(KNOWN)}; "
        "for other files pass --trace-format table --columns ... (YAML: trace_format)"
    )


def detect_format(path: str | Path) -> str:
    """The format name of the trace at ``path`` (see the module docstring)."""
    p = Path(path)
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:
            first = ""
            for line in f:
                if line.strip():
                    first = line.strip()
                    break
    except FileNotFoundError:
        raise WorkloadError(f"{p}: trace file not found") from None
    except IsADirectoryError:
        raise WorkloadError(f"{p}: is a directory, not a trace file") from None
    except UnicodeDecodeError:
        if p.suffix.lower() == ".parquet":
            raise WorkloadError(
                f"{p}: parquet traces need --trace-format table --columns ..."
            ) from None
        raise _unknown(p, "a binary file") from None
    if not first:
        raise WorkloadError(f"{p}: the trace file is empty")
    if first.startswith("["):
        return "sharegpt"
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{p}: line 1: not valid JSON ({e.msg})") from None
        if isinstance(obj, dict) and ({"input_length", "output_length"} & set(obj)):
            return "mooncake"
        keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise _unknown(p, f"first line (fields: {keys})")
    columns = [c.strip() for c in next(csv.reader([first]))]
    for name, cols in _CSV_SIGNATURES:
        if cols.intersection(columns):
            return name
    shown = ", ".join(columns)
    raise _unknown(p, f"header ({shown[:200]})")
