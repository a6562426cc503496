"""Aladdin §4.1: the worker configuration (GPUs per worker) with the best per-GPU throughput.

For each tensor-parallel degree ``N_g`` the decode iteration of a batch of ``b`` requests
with average context ``l`` costs ``t_compute + t_comm`` (Eq. 5):

- ``t_compute = k4/N_g + c4``: k4 and c4 are fitted by least squares over the TP degrees
  asked for, to the compute-only time (all-reduces removed) of the roofline model of the
  model on that GPU (:class:`~sloserve.costmodel.roofline.RooflineCostModel`), at each
  batch size;
- ``t_comm = n_ar · t_allreduce(b·hidden·dtype bytes, N_g)``, ``n_ar = 2·layers + 1``
  all-reduces per iteration, the all-reduce calibrated from Vidur's network profile
  (:mod:`sloserve.cluster.aladdin.allreduce`), ∝ ``(N_g − 1)/N_g``.

KV capacity ``M = N_g·m_gpu − m_model`` in tokens
(:func:`~sloserve.costmodel.profile.kv_capacity`, with the memory utilisation and
activation reserve a replica gets). Eq. 6 then gives the per-GPU throughput (tokens/s)
``T_max = min(M/(N_g·m_r·t(M/m_r)), B/(N_g·T_decode))``: ``B`` is the largest batch whose
iteration meets the ATGT SLO, ``M/m_r`` the batch the KV cache holds. The best ``N_g``
maximises it.

Choices where the paper is vague:

- ``m_r``, the per-request KV demand, is the time-average KV a request holds, the mean of
  ``l_in + l_out/2`` over the workload's lengths (a request's KV grows from ``l_in`` to
  ``l_in + l_out`` while it decodes); the same mean is the average context ``l``.
- A degree whose weights do not fit, or whose heads do not split, is reported as
  infeasible (throughput 0); asking only for such degrees is an error.
- A degree over the machine's GPUs (``gpus_per_machine``, 8) is an error: a worker never
  spans machines in Aladdin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloserve.cluster.aladdin.allreduce import AllReduceFit
from sloserve.core.errors import ConfigError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.profile import kv_capacity
from sloserve.costmodel.roofline import RooflineCostModel

MAX_BATCH = 4096


@dataclass(frozen=True)
class TPOption:
    """One TP degree's numbers (Eq. 5–6); ``feasible`` False when the weights do not fit."""

    gpus: int
    feasible: bool
    kv_tokens: int = 0
    kv_batch: float = 0.0
    slo_batch: int = 0
    iter_s_at_kv_batch: float = 0.0
    comm_s_at_slo_batch: float = 0.0
    per_gpu_tokens_s: float = 0.0
    why: str = ""


@dataclass(frozen=True)
class WorkerConfig:
    """The chosen GPUs per worker and every option considered."""

    best_gpus: int
    options: tuple[TPOption, ...]
    k4: dict[int, float] = field(default_factory=dict)
    """k4 (seconds·GPUs) per batch size at the SLO batch of each option (diagnostic)."""
    m_r: float = 0.0
    atgt_s: float = 0.0

    def report(self) -> dict[str, Any]:
        return {
            "best_gpus_per_worker": self.best_gpus,
            "m_r_tokens": self.m_r,
            "atgt_s": self.atgt_s,
            "options": [o.__dict__ for o in self.options],
        }


def _compute_fit(
    model: ModelSpec, gpu: GPUSpec, degrees: Sequence[int], batches: np.ndarray, l_ave: float
) -> tuple[np.ndarray, np.ndarray]:
    """k4(b), c4(b) over ``batches`` fitted across ``degrees`` (one roofline per degree)."""
    times = []
    usable = []
    for n in degrees:
        if model.num_heads % n:
            continue
        rm = RooflineCostModel(model, gpu, n)
        t = np.array([rm.decode_time(int(b), int(b * l_ave)) for b in batches])
        t = t - np.asarray(rm.all_reduce_time(batches), dtype=np.float64) * (n > 1)
        times.append(t)
        usable.append(n)
    a = np.column_stack([1.0 / np.asarray(usable, dtype=np.float64), np.ones(len(usable))])
    y = np.vstack(times)  # degrees × batches
    if len(usable) == 1:  # one degree: all of it is k4/N_g (no c4 can be told apart)
        return y[0] * usable[0], np.zeros(len(batches))
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return coef[0], coef[1]


def choose_worker_config(
    model: ModelSpec,
    gpu: GPUSpec,
    degrees: Sequence[int],
    *,
    atgt_s: float,
    m_r: float,
    all_reduce: AllReduceFit,
    kv_utilization: float = 0.9,
    gpus_per_machine: int = 8,
) -> WorkerConfig:
    """Eq. 5–6 for each degree in ``degrees``; the best per-GPU throughput wins (ties: the
    fewer GPUs). Raises :class:`ConfigError` for a degree the machine cannot hold, a
    non-positive ``m_r`` or ATGT, or when no degree fits the model."""
    if not degrees:
        raise ConfigError("tp: give at least one degree")
    for n in degrees:
        if not 1 <= n <= gpus_per_machine:
            raise ConfigError(
                f"tp: {n} GPUs per worker is outside 1..{gpus_per_machine} (GPUs per machine)"
            )
    if not atgt_s > 0:
        raise ConfigError(f"slo_atgt_ms: {atgt_s * 1e3:g} must be positive")
    if not m_r > 0:
        raise ConfigError(f"m_r: {m_r:g} tokens must be positive")
    degs = sorted(set(degrees))
    batches = np.arange(1, MAX_BATCH + 1, dtype=np.float64)
    k4, c4 = _compute_fit(model, gpu, degs, batches, m_r)
    bytes_per_allreduce = batches * model.hidden_size * model.dtype_bytes
    n_ar = 2 * model.num_layers + 1
    options = []
    k4_at: dict[int, float] = {}
    for n in degs:
        if model.num_heads % n:
            options.append(TPOption(n, False, why=f"{model.num_heads} heads do not split"))
            continue
        m = kv_capacity(model, gpu, n, kv_utilization)
        if m <= 0:
            options.append(TPOption(n, False, why="weights do not fit"))
            continue
        comm = n_ar * np.array([all_reduce.time(s, n) for s in bytes_per_allreduce])
        t = k4 / n + c4 + comm
        meets = np.flatnonzero(t <= atgt_s)
        slo_b = int(batches[meets[-1]]) if len(meets) else 0
        kv_b = m / m_r
        i = min(max(int(kv_b), 1), MAX_BATCH) - 1
        t_kv = float(t[i])
        kv_term = kv_b / (n * t_kv) if kv_b >= 1 else 0.0
        slo_term = slo_b / (n * atgt_s)
        k4_at[n] = float(k4[max(slo_b, 1) - 1])
        options.append(
            TPOption(
                n,
                True,
                kv_tokens=m,
                kv_batch=kv_b,
                slo_batch=slo_b,
                iter_s_at_kv_batch=t_kv,
                comm_s_at_slo_batch=float(comm[max(slo_b, 1) - 1]),
                per_gpu_tokens_s=min(kv_term, slo_term),
            )
        )
    feasible = [o for o in options if o.feasible and o.per_gpu_tokens_s > 0]
    if not feasible:
        raise ConfigError(
            f"tp: no degree in {','.join(map(str, degs))} serves {model.name} on {gpu.name} "
            f"within {atgt_s * 1e3:g} ms ATGT"
        )
    best = max(feasible, key=lambda o: (o.per_gpu_tokens_s, -o.gpus))
    return WorkerConfig(best.gpus, tuple(options), k4_at, m_r, atgt_s)


def worker_config_for(
    model: str,
    gpu: str,
    degrees: Sequence[int],
    *,
    atgt_s: float,
    mix: str = "sharegpt",
    link: str | None = None,
    vidur_dir: str = "../shared/vidur-profiling",
    kv_utilization: float = 0.9,
) -> WorkerConfig:
    """:func:`choose_worker_config` from catalog names: ``m_r`` from the mix's history, the
    all-reduce from Vidur's network profile scaled to ``gpu`` over ``link`` (default: NVLink
    when the GPU has it, else PCIe)."""
    from sloserve.cluster.aladdin.allreduce import fit_all_reduce
    from sloserve.cluster.aladdin.lengths import history, mean_kv_demand
    from sloserve.costmodel import catalog

    mspec, gspec = catalog.model_spec(model), catalog.gpu_spec(gpu)
    link = link or ("nvlink" if gspec.nvlink_gb_per_s is not None else "pcie")
    ar = fit_all_reduce(vidur_dir).scaled(gspec, link)
    p, o = history(mix)
    return choose_worker_config(
        mspec,
        gspec,
        degrees,
        atgt_s=atgt_s,
        m_r=mean_kv_demand(p, o),
        all_reduce=ar,
        kv_utilization=kv_utilization,
    )
