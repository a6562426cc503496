"""Vidur's model/GPU pairs, the TP degree each is calibrated at, and the table loaders.

Pairs, TP and names
    Every ``compute/<gpu>/<org>/<model>/mlp.csv`` is one pair (GPUs ``a100`` = A100-80GB,
    ``h100`` = H100-80GB SXM, ``a40``; models resolved in the catalog by their Hugging Face
    id). The TP degree is the smallest one the ``mlp.csv`` has rows for whose weights fit
    with room for KV: ``M(0.9) ≥ max(max_context, 16384)`` tokens — one request of the
    model's full context and a batch's worth (16 × 1,024) of ordinary ones; the 1 GiB per-GPU
    activation reserve of every profile is included. Names are ``<model>-<gpu>`` plus
    ``x<tp>`` when ``tp > 1`` (``llama-2-7b-a100``, ``qwen-72b-a100x4``), the two original
    built-in names included.

Loaders
    :func:`load_mlp` is :func:`sloserve.costmodel.fit.vidur_tables.load_mlp_table` tolerating
    absent per-layer operators; :func:`load_all_reduce_rows` can keep only the rows of one
    ``devices_per_node``. Tables are read once per process (cached).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel import catalog
from sloserve.costmodel.fit.vidur_tables import (
    PER_ITERATION_OPS,
    PER_LAYER_OPS,
    load_attention_tables,
    load_mlp_table,
)
from sloserve.costmodel.profile import DEFAULT_ACTIVATION_RESERVE_GIB, kv_capacity

VIDUR_GPUS: dict[str, str] = {"a100": "a100-80gb", "h100": "h100-80gb", "a40": "a40"}
"""Vidur's GPU directory names → catalog GPU keys."""

REFERENCE_MODEL = "llama-2-70b"
REFERENCE_GPU = "a100"
REFERENCE_TP = 2
REFERENCE_PROFILE = "llama-2-70b-a100x2"
"""The only pair with measured attention."""

MIN_KV_TOKENS = 16384
"""Room for KV a TP must leave: at least this many tokens (and the model's max context)."""

UTILIZATION = 0.9
"""GPU memory utilisation at which the TP choice checks the KV room."""


def _sig(v: float, sig: int = 6) -> float:
    return float(f"{v:.{sig}g}")


# ---------------------------------------------------------------------------- pairs and TP


@dataclass(frozen=True)
class VidurPair:
    """One ``compute/<gpu>/<org>/<model>/mlp.csv`` of Vidur's data."""

    gpu_dir: str
    model_dir: str
    model_key: str
    gpu_key: str
    mlp_rel: str
    tps: tuple[int, ...]

    @property
    def model(self) -> ModelSpec:
        """The catalog spec of the pair's model."""
        return catalog.model_spec(self.model_key)

    @property
    def gpu(self) -> GPUSpec:
        """The catalog spec of the pair's GPU."""
        return catalog.gpu_spec(self.gpu_key)


@cache
def _read_csv(path: str) -> pd.DataFrame:
    return pd.read_csv(path)


def vidur_pairs(vidur_dir: str | Path) -> list[VidurPair]:
    """Every model/GPU pair with an ``mlp.csv`` under ``vidur_dir/compute``."""
    root = Path(vidur_dir)
    out = []
    for path in sorted(root.glob("compute/*/*/*/mlp.csv")):
        gpu_dir, org, model = path.parts[-4], path.parts[-3], path.parts[-2]
        if gpu_dir not in VIDUR_GPUS:
            raise ConfigError(f"{path}: unknown Vidur GPU directory {gpu_dir!r}")
        tps = tuple(
            sorted(int(t) for t in _read_csv(str(path))["num_tensor_parallel_workers"].unique())
        )
        out.append(
            VidurPair(
                gpu_dir=gpu_dir,
                model_dir=f"{org}/{model}",
                model_key=catalog.model_key(f"{org}/{model}"),
                gpu_key=VIDUR_GPUS[gpu_dir],
                mlp_rel=str(path.relative_to(root)),
                tps=tps,
            )
        )
    return out


def min_kv_tokens(model: ModelSpec) -> int:
    """The KV room a TP choice must leave (see the module docstring)."""
    return max(model.max_context, MIN_KV_TOKENS)


def choose_tp(
    model: ModelSpec,
    gpu: GPUSpec,
    tps: Iterable[int],
    utilization: float = UTILIZATION,
    min_tokens: int | None = None,
) -> int:
    """The smallest TP in ``tps`` with ``M(utilization) ≥ min_tokens`` (default
    :func:`min_kv_tokens`)."""
    need = min_kv_tokens(model) if min_tokens is None else min_tokens
    for tp in sorted(tps):
        if model.num_heads % tp:
            continue
        if kv_capacity(model, gpu, tp, utilization, DEFAULT_ACTIVATION_RESERVE_GIB) >= need:
            return tp
    raise ConfigError(
        f"{model.name} on {gpu.name}: no TP in {sorted(tps)} leaves {need} tokens of KV"
    )


def calibrated_profile_name(model_key: str, gpu_dir: str, tp: int) -> str:
    """``<model>-<gpu>`` plus ``x<tp>`` when ``tp > 1``."""
    return f"{model_key}-{gpu_dir}" + (f"x{tp}" if tp > 1 else "")


# ---------------------------------------------------------------------------- loaders


def load_mlp(path: str | Path, tp: int, num_layers: int) -> pd.DataFrame:
    """:func:`vidur_tables.load_mlp_table`, tolerating absent per-layer operators (counted as 0).

    Same columns (``num_tokens``, ``layer_ms``, ``emb_ms``, ``iteration_ms``).
    """
    df = _read_csv(str(path))
    ops = {c.split(".")[1] for c in df.columns if c.startswith("time_stats.")}
    unknown = ops - set(PER_LAYER_OPS) - set(PER_ITERATION_OPS)
    if unknown:
        raise ValueError(f"{path}: unclassified operators {sorted(unknown)}")
    if set(PER_LAYER_OPS) <= ops:
        return load_mlp_table(path, tp, num_layers)
    rows = df[df["num_tensor_parallel_workers"] == tp]
    if rows.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    layer = [f"time_stats.{o}.median" for o in PER_LAYER_OPS if o in ops]
    per_iter = [f"time_stats.{o}.median" for o in PER_ITERATION_OPS if o in ops]
    out = pd.DataFrame(
        {
            "num_tokens": rows["num_tokens"].astype(np.int64),
            "layer_ms": rows[layer].sum(axis=1),
            "emb_ms": rows[per_iter].sum(axis=1),
        }
    )
    out = out.groupby("num_tokens", as_index=False).median().sort_values("num_tokens")
    out["iteration_ms"] = num_layers * out["layer_ms"] + out["emb_ms"]
    return out.reset_index(drop=True)


def all_reduce_topology(gpu_dir: str, tp: int) -> str | None:
    """The ``network/<topology>`` a TP replica on ``gpu_dir`` runs on (None: no data)."""
    if gpu_dir not in ("a100", "h100") or tp < 2:
        return None
    return f"{gpu_dir}_pairwise_nvlink" if tp == 2 else f"{gpu_dir}_dgx"


def load_all_reduce_rows(
    path: str | Path, num_workers: int, devices_per_node: int | None = None
) -> pd.DataFrame:
    """Median all-reduce time (ms) vs ``size`` for ``num_workers`` GPUs, optionally only the
    rows with ``devices_per_node`` GPUs per node (vidur_tables' loader does not filter on it)."""
    df = _read_csv(str(path))
    rows = df[df["num_workers"] == num_workers]
    if devices_per_node is not None:
        rows = rows[rows["devices_per_node"] == devices_per_node]
    if rows.empty:
        raise ValueError(f"{path}: no rows with num_workers == {num_workers}")
    out = pd.DataFrame(
        {"size": rows["size"].astype(np.int64), "time_ms": rows["time_stats.all_reduce.median"]}
    )
    return out.groupby("size", as_index=False).median().sort_values("size").reset_index(drop=True)


@cache
def _attention_tables(path: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    return load_attention_tables(path)
