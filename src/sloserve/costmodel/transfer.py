"""Transfer times: KV-cache swaps over PCIe and model loading through the storage tiers.

KV swaps
    ``tokens × KV bytes per token / (PCIe rate × tp)``: every GPU of a tensor-parallel
    replica holds ``1/tp`` of each token's KV and moves it over its own host link, in
    parallel. The PCIe rate is the GPU spec's *effective* ``pcie_gb_per_s`` (about 80% of the
    nominal per-direction x16 rate: 25 GB/s Gen4, 50 GB/s Gen5, 12 GB/s Gen3; pinned
    memory, large copies). An optional fixed latency per swap covers the launch and the
    block-table update. This is the same formula :class:`~sloserve.costmodel.linear.
    LinearCostModel` and the roofline model use for ``swap_time``.

Model loading (QLM's warm start)
    Weights live in one of three tiers: ``gpu`` (already resident: no load), ``cpu`` (host
    memory, e.g. a model kept warm in pinned RAM), ``disk`` (local NVMe). Loading from
    ``cpu`` costs ``weights / (PCIe × tp)`` (each GPU loads its shard over its own link);
    from ``disk`` it costs the disk read of the whole checkpoint *plus* the copy to the GPUs:
    the two stages are not overlapped (a checkpoint is read into host memory tensor by
    tensor and copied; across a whole model the stages alternate, so the sum is the
    realistic bound). ``init_s`` (default 0) adds a fixed start-up (CUDA context, graph
    capture, KV allocation), which the papers either leave out or fold into measured load
    times.

    Default disk bandwidth: 2 GB/s (``DEFAULT_DISK_GB_PER_S``): one data-centre NVMe SSD
    reads 3–7 GB/s sequentially, but safetensors loading through the page cache achieves
    about 1–3 GB/s; network file systems are slower (pass ``disk_gb_per_s``).

KV transfers between replicas (disaggregated prefill/decode)
    ``latency + tokens × KV bytes per token per GPU / link rate``: each GPU of a
    tensor-parallel prefill replica sends its shard to its peer in parallel. The default
    link rate per GPU kind (``MEASURED_KV_LINK_GB_PER_S``) is Vidur's measured
    point-to-point ``send_recv`` between two GPUs of one node (NCCL over NVLink),
    ``vidur-profiling/network/<gpu>_dgx/send_recv.csv``: ``size`` is bytes (Vidur's
    profiler writes ``size * 2`` for fp16 elements, "# bytes"), times are ms; the rate is
    the median of ``size / median time`` over the rows with ``devices_per_node == 2``
    (both GPUs in one node) and sizes of 32–64 MiB (where the rate has levelled off):
    A100 (``a100_dgx``) 224.0 GB/s, H100 (``h100_dgx``) 340.8 GB/s, A40
    (``a40_pairwise_nvlink``, the only A40 file) 4.0 GB/s. The ``h100_pairwise_nvlink``
    file is a byte-for-byte copy of the A100 one, so it is not used. Rows with
    ``devices_per_node == 1`` (two nodes) give 7.8 GB/s (A100) and 35.3 GB/s (H100): pass
    ``kv_link_gb_per_s`` for prefill and decode replicas on different nodes. A GPU without
    a measurement, or without NVLink (a PCIe card), uses its PCIe rate.
"""

from __future__ import annotations

from typing import Literal, get_args

from sloserve.core.errors import UnknownNameError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.profile import ReplicaProfile

Tier = Literal["gpu", "cpu", "disk"]
"""Where a model's weights are before it is loaded (QLM's warm-start tiers)."""

TIERS: tuple[str, ...] = get_args(Tier)

DEFAULT_DISK_GB_PER_S = 2.0
"""Effective checkpoint read rate from local NVMe, GB/s (see the module docstring)."""


def _hardware(
    target: ReplicaProfile | ModelSpec, gpu: GPUSpec | None, tp: int | None
) -> tuple[ModelSpec, GPUSpec | None, int]:
    if isinstance(target, ReplicaProfile):
        return target.model, gpu or target.gpu, tp or target.tp
    return target, gpu, tp or 1


def kv_swap_time(
    num_tokens: int,
    target: ReplicaProfile | ModelSpec,
    gpu: GPUSpec | None = None,
    tp: int | None = None,
    *,
    pcie_gb_per_s: float | None = None,
    latency_s: float = 0.0,
) -> float:
    """Seconds to move ``num_tokens`` tokens of KV between GPU and host (one direction).

    ``target`` is a profile (its GPU and TP are used unless given) or a :class:`ModelSpec`
    with ``gpu`` (or an explicit ``pcie_gb_per_s``) and ``tp``.
    """
    if num_tokens <= 0:
        return 0.0
    model, g, n = _hardware(target, gpu, tp)
    rate = pcie_gb_per_s if pcie_gb_per_s is not None else (g.pcie_gb_per_s if g else None)
    if rate is None:
        raise ValueError("kv_swap_time needs a GPU spec or pcie_gb_per_s")
    return latency_s + num_tokens * model.kv_bytes_per_token_tp(n) / (rate * 1e9 * n)


def model_load_time(
    target: ReplicaProfile | ModelSpec,
    tier: str,
    gpu: GPUSpec | None = None,
    tp: int | None = None,
    *,
    disk_gb_per_s: float = DEFAULT_DISK_GB_PER_S,
    pcie_gb_per_s: float | None = None,
    init_s: float = 0.0,
) -> float:
    """Seconds to make a model servable from ``tier`` (``gpu``, ``cpu`` or ``disk``).

    ``gpu``: ``init_s`` only (the weights are resident). ``cpu``: PCIe copy of each GPU's
    shard. ``disk``: the checkpoint read at ``disk_gb_per_s`` plus the PCIe copy.
    """
    if tier not in TIERS:
        raise UnknownNameError(f"unknown tier {tier!r}; valid: {', '.join(TIERS)}")
    if disk_gb_per_s <= 0:
        raise ValueError("disk_gb_per_s must be > 0")
    model, g, n = _hardware(target, gpu, tp)
    if tier == "gpu":
        return init_s
    rate = pcie_gb_per_s if pcie_gb_per_s is not None else (g.pcie_gb_per_s if g else None)
    if rate is None:
        raise ValueError("model_load_time needs a GPU spec or pcie_gb_per_s")
    to_gpu = model.weight_bytes / (rate * 1e9 * n)
    if tier == "cpu":
        return init_s + to_gpu
    return init_s + model.weight_bytes / (disk_gb_per_s * 1e9) + to_gpu


def load_times(
    target: ReplicaProfile | ModelSpec,
    gpu: GPUSpec | None = None,
    tp: int | None = None,
    **kwargs: float,
) -> dict[str, float]:
    """:func:`model_load_time` for every tier, by tier name."""
    return {t: model_load_time(target, t, gpu, tp, **kwargs) for t in TIERS}


def weights_load_time(
    weight_bytes: float,
    tier: str,
    *,
    tp: int = 1,
    disk_gb_per_s: float = DEFAULT_DISK_GB_PER_S,
    pcie_gb_per_s: float,
    init_s: float = 0.0,
) -> float:
    """:func:`model_load_time` for a checkpoint of ``weight_bytes`` bytes (a model registry
    may override a model's size): ``gpu`` costs ``init_s``, ``cpu`` the PCIe copy of each
    of the ``tp`` shards, ``disk`` the read of the whole checkpoint plus that copy."""
    if tier not in TIERS:
        raise UnknownNameError(f"unknown tier {tier!r}; valid: {', '.join(TIERS)}")
    if disk_gb_per_s <= 0 or pcie_gb_per_s <= 0:
        raise ValueError("bandwidths must be > 0")
    if tier == "gpu":
        return init_s
    to_gpu = weight_bytes / (pcie_gb_per_s * 1e9 * tp)
    if tier == "cpu":
        return init_s + to_gpu
    return init_s + weight_bytes / (disk_gb_per_s * 1e9) + to_gpu


def kv_transfer_time(
    num_tokens: int, kv_bytes_per_token: float, *, link_gb_per_s: float, latency_s: float = 0.0
) -> float:
    """Seconds to move ``num_tokens`` tokens of KV from one replica to another over a link
    of ``link_gb_per_s`` GB/s (disaggregated prefill/decode): ``latency + bytes / rate``."""
    if link_gb_per_s <= 0:
        raise ValueError("link_gb_per_s must be > 0")
    if num_tokens <= 0:
        return 0.0
    return latency_s + num_tokens * kv_bytes_per_token / (link_gb_per_s * 1e9)


MEASURED_KV_LINK_GB_PER_S: dict[str, float] = {"A100": 224.0, "H100": 340.8, "A40": 4.0}
"""Measured intra-node GPU-to-GPU rate by GPU family, GB/s (module docstring)."""


def default_kv_link_gb_per_s(gpu: GPUSpec) -> float:
    """The KV link rate for replicas on ``gpu``: its family's measured NVLink rate
    (``MEASURED_KV_LINK_GB_PER_S``, matched on the name's prefix), else its PCIe rate.
    A PCIe-only card of a measured family (``A100-80GB-PCIe``: no NVLink) moves KV over
    PCIe: the family's measurement is NVLink's."""
    if gpu.nvlink_gb_per_s is None:
        return gpu.pcie_gb_per_s
    name = gpu.name.upper()
    for family, rate in MEASURED_KV_LINK_GB_PER_S.items():
        if name.startswith(family + "-") or name == family:
            return rate
    return gpu.pcie_gb_per_s
