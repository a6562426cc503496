"""The measurement driver: time a grid of iterations, one profile CSV row per shape.

Choices
-------
* Timing: CUDA uses ``torch.cuda.synchronize`` around the pass and CUDA events (no
  synchronisation inside the pass); CPU uses ``time.perf_counter``. Each shape gets
  ``warmup`` unmeasured passes then ``repeats`` measured ones; the row reports the **median
  repeat** (by total time; the lower median for an even count) with that same repeat's group
  times, so the groups never add up to more than the total. ``time_min_s`` and
  ``time_max_s`` keep the spread.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import ModelSpec
from sloserve.costmodel.fit.profile_csv import (
    CSV_GROUP_COLUMNS,
    CSV_INPUT_COLUMNS,
    CSV_TIME_COLUMN,
    DEVICE_COLUMN_PREFIX,
    MODEL_COLUMN_PREFIX,
)
from sloserve.costmodel.profiler.grid import (
    DEFAULT_CONTEXTS,
    DEFAULT_DECODE_BATCHES,
    DEFAULT_PREFILL_CHUNKS,
    IterationShape,
    profile_grid,
)
from sloserve.costmodel.profiler.llama import _DTYPES, GIB, LlamaModel, _torch
from sloserve.costmodel.profiler.runners import _HFRunner, _OwnRunner, _Runner, _Sample
from sloserve.costmodel.profiler.timing import _Clock


def _device_facts(torch: Any, device: Any) -> tuple[str, float]:
    """(name, memory GiB) of the device, for the metadata columns."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return str(props.name), float(props.total_memory) / GIB
    name = platform.processor() or platform.machine() or "cpu"
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        mem = 0.0
    return f"cpu ({name}, {torch.get_num_threads()} threads)", float(mem)


def _resolve_device(torch: Any, device: str) -> Any:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but torch.cuda.is_available() is False")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu or cuda[:N], got {device!r}")
    return dev


def _measure(
    runner: _Runner,
    grid: Sequence[IterationShape],
    clock: _Clock,
    warmup: int,
    repeats: int,
    groups: bool,
    interleave: bool,
    progress: Callable[[int, int], None] | None,
) -> list[list[_Sample]]:
    """``repeats`` samples per shape, after ``warmup`` unmeasured passes of each.

    Interleaved: every shape is prepared and warmed up, then each of ``repeats`` rounds
    measures every shape once, so a burst of interference (another process, a clock change)
    costs one sample of many shapes, which the median discards, rather than every sample of
    a few. Sequential: shape by shape, holding one shape's inputs at a time.
    """
    torch = _torch()
    total = repeats * len(grid)
    done = 0
    out: list[list[_Sample]] = [[] for _ in grid]

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    with torch.inference_mode():
        if interleave:
            prepared = [runner.prepare(shape) for shape in grid]
            for prep in prepared:
                for _ in range(warmup):
                    runner.run(prep, clock, groups)
            for _ in range(repeats):
                for i, prep in enumerate(prepared):
                    out[i].append(runner.run(prep, clock, groups))
                    tick()
        else:
            for i, shape in enumerate(grid):
                prep = runner.prepare(shape)
                for _ in range(warmup):
                    runner.run(prep, clock, groups)
                for _ in range(repeats):
                    out[i].append(runner.run(prep, clock, groups))
                    tick()
                del prep
    return out


def profile_model(
    spec_or_model: ModelSpec | LlamaModel | str | Path,
    *,
    device: str = "cpu",
    prefill_chunks: Sequence[int] = DEFAULT_PREFILL_CHUNKS,
    decode_batches: Sequence[int] = DEFAULT_DECODE_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    hybrid: bool = True,
    shapes: Iterable[IterationShape] | None = None,
    repeats: int = 5,
    warmup: int = 2,
    dtype: str | None = None,
    measure_groups: bool = True,
    interleave: bool = True,
    cpu_threads: int | None = None,
    kv_memory_gib: float = 2.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Time forward passes over a grid of iterations; one row per shape (the CSV format).

    ``spec_or_model``: a :class:`ModelSpec` (the built-in Llama-style model with random
    weights is built from it), a :class:`LlamaModel`, or a local Hugging Face model directory
    (needs ``transformers``). ``shapes`` replaces the grid of :func:`profile_grid`
    (``prefill_chunks`` × ``contexts``, ``decode_batches`` × ``contexts``, hybrids).
    ``dtype``: ``float32`` (default on CPU), ``float16`` or ``bfloat16`` (default on CUDA);
    a :class:`LlamaModel` keeps its own.
    ``interleave``: measure in rounds over all shapes (default; holds every shape's inputs at
    once) or shape by shape. ``cpu_threads``: torch's intra-op threads while profiling on CPU
    (restored afterwards; ``None`` keeps the current setting). On a busy or shared CPU use 1:
    a multi-threaded pass stalls whenever one of its threads is descheduled.
    ``progress(done, total)`` is called after every measured pass.
    See :mod:`sloserve.costmodel.profiler` for what is timed.
    """
    if repeats < 1 or warmup < 0:
        raise ConfigError("repeats must be >= 1 and warmup >= 0")
    torch = _torch()
    dev = _resolve_device(torch, device)
    dtype_name = _DTYPES.get((dtype or ("bfloat16" if dev.type == "cuda" else "float32")).lower())
    if dtype_name is None:
        raise ConfigError(f"dtype must be one of {', '.join(sorted(_DTYPES))}, got {dtype!r}")
    runner: _Runner
    if isinstance(spec_or_model, LlamaModel):
        if spec_or_model.device != dev:
            raise ConfigError(f"the model is on {spec_or_model.device}, profiling on {dev}")
        runner = _OwnRunner(spec_or_model, kv_memory_gib, seed)
    elif isinstance(spec_or_model, ModelSpec):
        model = LlamaModel(spec_or_model, device=str(dev), dtype=dtype_name, seed=seed)
        runner = _OwnRunner(model, kv_memory_gib, seed)
    else:
        runner = _HFRunner(str(spec_or_model), dev, getattr(torch, dtype_name), seed)
    grid = (
        list(shapes)
        if shapes is not None
        else profile_grid(prefill_chunks, decode_batches, contexts, hybrid)
    )
    grid = [s for s in grid if runner.supports(s)]
    too_long = [s for s in grid if s.max_position > runner.spec.max_context]
    if too_long:
        raise ConfigError(
            f"a shape reaches position {too_long[0].max_position}, beyond the model's "
            f"max_context {runner.spec.max_context}"
        )
    if not grid:
        raise ConfigError("no iteration shapes to measure")
    groups = measure_groups and runner.supports_groups
    clock = _Clock(torch, dev)
    threads_before = torch.get_num_threads()
    if cpu_threads is not None and dev.type == "cpu":
        if cpu_threads < 1:
            raise ConfigError(f"cpu_threads must be >= 1, got {cpu_threads}")
        torch.set_num_threads(cpu_threads)
    try:
        dev_name, dev_mem = _device_facts(torch, dev)
        samples = _measure(runner, grid, clock, warmup, repeats, groups, interleave, progress)
    finally:
        torch.set_num_threads(threads_before)
    spec = runner.spec
    rows: list[dict[str, Any]] = []
    for shape, shape_samples in zip(grid, samples, strict=True):
        order = sorted(range(len(shape_samples)), key=lambda j: shape_samples[j].total)
        med = shape_samples[order[(len(order) - 1) // 2]]
        st = shape.stats
        row: dict[str, Any] = {
            "num_prefill_tokens": st.num_prefill_tokens,
            "num_prefill_seqs": st.num_prefill_seqs,
            "prefill_attn_work": st.prefill_attn_work,
            "num_decode": st.num_decode,
            "decode_context_sum": st.decode_context_sum,
            CSV_TIME_COLUMN: med.total,
        }
        if med.groups is not None:
            dec = med.groups["decode"] if st.num_decode else None
            pre = med.groups["prefill"] if st.num_prefill_tokens else None
            row[CSV_GROUP_COLUMNS["decode_attention"]] = dec
            row[CSV_GROUP_COLUMNS["prefill_attention"]] = pre
            row[CSV_GROUP_COLUMNS["non_attention"]] = med.total - (dec or 0.0) - (pre or 0.0)
        row |= {
            "kind": shape.kind,
            "repeats": repeats,
            "time_min_s": shape_samples[order[0]].total,
            "time_max_s": shape_samples[order[-1]].total,
            "device": dev_name,
            DEVICE_COLUMN_PREFIX + "memory_gib": round(dev_mem, 3),
            "dtype": runner.dtype_name,
            "tp": 1,
            "model": spec.name,
        }
        for f in ModelSpec.model_fields:
            if f != "name":
                row[MODEL_COLUMN_PREFIX + f] = getattr(spec, f)
        rows.append(row)
    df = pd.DataFrame(rows)
    first = [*CSV_INPUT_COLUMNS, CSV_TIME_COLUMN]
    return df[first + [c for c in df.columns if c not in first]]


def write_profile_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a profile table (from :func:`profile_model`) as CSV; returns the path.

    Times are written with full precision; empty group cells stay empty.
    """
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(p, index=False, float_format="%.9g")
    except OSError as e:
        raise ConfigError(f"{p}: cannot write profile CSV ({e.strerror})") from e
    return p
