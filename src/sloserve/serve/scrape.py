"""Engine load from an upstream's Prometheus ``/metrics`` text.

Understands vLLM (``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc`` or the older ``vllm:gpu_cache_usage_perc``), SGLang
(``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``) and
sloserve's own per-replica gauges (another sloserve gateway as an upstream). Series with
several label sets (one per model, one per replica) are summed for request counts and
averaged for KV usage, which is a fraction 0..1 in all three (vLLM's "perc" included).
Metrics an engine does not export stay ``None``: the caller falls back to its own counts.

Needs ``prometheus_client`` (the ``serve`` extra); imported lazily by the functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WAITING_NAMES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "sloserve_replica_waiting")
RUNNING_NAMES = ("vllm:num_requests_running", "sglang:num_running_reqs", "sloserve_replica_running")
KV_NAMES = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "sloserve_replica_kv_usage_ratio",
    "sloserve_replica_kv_usage",  # its earlier name (an older sloserve gateway upstream)
)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine's metrics say about its load; ``None`` where it says nothing."""

    waiting: int | None = None
    running: int | None = None
    kv_usage: float | None = None


def parse_engine_load(text: str) -> EngineLoad:
    """Extract waiting/running/KV usage from Prometheus exposition text.

    Raises ``ValueError`` when the text is not valid exposition format (the caller treats
    that as "no metrics", never as an unhealthy upstream).
    """
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, list[float]] = {}
    wanted = {*WAITING_NAMES, *RUNNING_NAMES, *KV_NAMES}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # NaN and ±Inf say nothing usable about load (and Inf cannot be rounded).
            if sample.name in wanted and math.isfinite(sample.value):
                values.setdefault(sample.name, []).append(float(sample.value))

    def first(names: tuple[str, ...]) -> list[float] | None:
        for n in names:
            if n in values:
                return values[n]
        return None

    def count(names: tuple[str, ...]) -> int | None:
        vs = first(names)
        total = None if vs is None else sum(vs)
        return None if total is None or not math.isfinite(total) else max(0, round(total))

    kv = first(KV_NAMES)
    mean = None if kv is None else sum(kv) / len(kv)
    return EngineLoad(
        waiting=count(WAITING_NAMES),
        running=count(RUNNING_NAMES),
        kv_usage=None if mean is None or not math.isfinite(mean) else min(1.0, max(0.0, mean)),
    )
