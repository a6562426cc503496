"""``sloserve calibrate``: measure execute mode's own iterations, fit a profile.

The grid is the profiler's (:func:`~sloserve.costmodel.profiler.profile_grid`: prefill
chunks × contexts, decode batches × contexts, hybrids), but each shape runs through
:class:`~sloserve.engine.execute.TorchExecutor` exactly as execute mode runs an iteration
(paged cache sync, packed forward, sampling), so the fitted profile predicts what
``--executor torch`` measures, overheads included. Each shape gets ``warmup`` unmeasured
runs and ``repeats`` measured ones; its row keeps the median. The rows are written in the
profile CSV format (:mod:`sloserve.costmodel.fit.profile_csv`) next to the YAML, fitted with
:func:`~sloserve.costmodel.fit.profile_from_csv` and written with
:func:`~sloserve.costmodel.fit.write_profile_yaml`: ``--profile FILE.yaml`` then loads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import ModelSpec
from sloserve.core.request import Request, RequestStatus
from sloserve.costmodel.base import ConstantCostModel
from sloserve.costmodel.fit import profile_from_csv, write_profile_yaml
from sloserve.costmodel.fit.profile_csv import (
    CSV_INPUT_COLUMNS,
    CSV_TIME_COLUMN,
    DEVICE_COLUMN_PREFIX,
    MODEL_COLUMN_PREFIX,
)
from sloserve.costmodel.profile import ReplicaProfile
from sloserve.costmodel.profiler import IterationShape, profile_grid
from sloserve.costmodel.profiler.measure import _device_facts, write_profile_csv
from sloserve.engine.execute import LoadedModel, TorchExecutor
from sloserve.engine.executor import ExecBatch
from sloserve.engine.kv import PagedKVManager

SMALL_GRID = {
    "prefill_chunks": (32, 128, 512),
    "decode_batches": (1, 8, 32),
    "contexts": (0, 256, 1024),
}
"""The default grid: small enough to measure a 7B model in well under a minute."""


def _batch(shape: IterationShape, kv: PagedKVManager) -> tuple[tuple[Any, ...], list[Request]]:
    reqs: list[Request] = []
    batch: list[tuple[Request, int]] = []
    rid = 0
    # A decode reading ctx tokens is a request whose last prompt token runs now.
    for c, ctx in shape.prefill:
        reqs.append(Request(req_id=rid, arrival=0.0, num_prompt_tokens=ctx + c, true_output_len=1))
        batch.append((reqs[-1], c))
        rid += 1
    for ctx in shape.decode:
        reqs.append(Request(req_id=rid, arrival=0.0, num_prompt_tokens=ctx + 1, true_output_len=1))
        batch.append((reqs[-1], 1))
        rid += 1
    for r, n in batch:
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = r.num_prompt_tokens - n
        if kv.allocate(r.req_id, r.num_prompt_tokens) is None:
            raise ConfigError(f"calibration shape {shape} does not fit the KV cache")
    return tuple(batch), reqs


def measure_grid(
    loaded: LoadedModel,
    shapes: Sequence[IterationShape],
    *,
    warmup: int = 2,
    repeats: int = 5,
    block_size: int = 16,
) -> pd.DataFrame:
    """One profile-CSV row per shape: the median measured execute-mode iteration."""
    spec = loaded.model.spec
    biggest = max(sum(c + x for c, x in s.prefill) + sum(x + 1 for x in s.decode) for s in shapes)
    blocks = -(-biggest // block_size) + len(max(shapes, key=lambda s: len(s.decode)).decode) + 8
    kv = PagedKVManager(blocks, block_size)
    ex = TorchExecutor(loaded, ConstantCostModel(1.0))
    dev_name, dev_mem = _device_facts(loaded.model.torch, loaded.model.device)
    dtype = str(loaded.model.dtype).removeprefix("torch.")
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        if shape.max_position > spec.max_context:
            continue
        batch, reqs = _batch(shape, kv)
        eb = ExecBatch(batch, shape.stats, False, kv)
        times = [ex.run(eb) for _ in range(warmup + repeats)][warmup:]
        for r in reqs:
            kv.free(r.req_id)
            r.status = RequestStatus.FINISHED
            ex.forget(r.req_id)
        st = shape.stats
        row: dict[str, Any] = {c: getattr(st, c) for c in CSV_INPUT_COLUMNS}
        row[CSV_TIME_COLUMN] = float(np.median(times))
        row |= {
            "kind": shape.kind,
            "repeats": repeats,
            "device": dev_name,
            DEVICE_COLUMN_PREFIX + "memory_gib": round(dev_mem, 3),
            "dtype": dtype,
            "tp": 1,
            "model": spec.name,
        }
        for f in ModelSpec.model_fields:
            if f != "name":
                row[MODEL_COLUMN_PREFIX + f] = getattr(spec, f)
        rows.append(row)
    if not rows:
        raise ConfigError("no calibration shape fits the model's context")
    return pd.DataFrame(rows)


def calibrate(
    loaded: LoadedModel,
    out: str | Path,
    *,
    prefill_chunks: Sequence[int] = SMALL_GRID["prefill_chunks"],
    decode_batches: Sequence[int] = SMALL_GRID["decode_batches"],
    contexts: Sequence[int] = SMALL_GRID["contexts"],
    warmup: int = 2,
    repeats: int = 5,
    name: str | None = None,
) -> tuple[ReplicaProfile, Path]:
    """Measure the grid, write ``out`` (profile YAML) and its CSV beside it; returns the
    profile and the CSV path."""
    out = Path(out)
    shapes = profile_grid(prefill_chunks, decode_batches, contexts, True)
    df = measure_grid(loaded, shapes, warmup=warmup, repeats=repeats)
    csv = write_profile_csv(df, out.with_suffix(".csv"))
    prof = profile_from_csv(csv, name=name or out.stem)
    write_profile_yaml(prof, out)
    return prof, csv
