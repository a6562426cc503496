"""The policy registry: names -> factories. Unknown names fail with the list of valid ones.

Extension point: :func:`register` a factory ``(params: dict) -> Scheduler`` under a new
name; registering a name twice is an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.engine.interface import PreemptionMode, Scheduler
from sloserve.policies.unified import UnifiedConfig, UnifiedScheduler

PolicyFactory = Callable[[Mapping[str, Any]], Scheduler]

_REGISTRY: dict[str, tuple[PolicyFactory, str]] = {}


def register(name: str, factory: PolicyFactory, summary: str) -> None:
    """Add a policy; names are unique."""
    if name in _REGISTRY:
        raise ConfigError(f"policy {name!r} is already registered")
    _REGISTRY[name] = (factory, summary)


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def policy_summaries() -> dict[str, str]:
    return {n: _REGISTRY[n][1] for n in policy_names()}


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Scheduler:
    """Build a registered policy, overriding its preset parameters with ``params``."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UnknownNameError(f"unknown policy {name!r}; valid: {', '.join(policy_names())}")
    return entry[0](dict(params or {}))


def _unified(name: str, base: UnifiedConfig) -> PolicyFactory:
    fields = {f.name for f in dataclasses.fields(UnifiedConfig)}

    def factory(params: Mapping[str, Any]) -> Scheduler:
        unknown = sorted(set(params) - fields)
        if unknown:
            raise ConfigError(
                f"policy {name!r}: unknown parameter(s) {', '.join(unknown)}; "
                f"valid: {', '.join(sorted(fields))}"
            )
        p = dict(params)
        if "preemption_mode" in p:
            p["preemption_mode"] = PreemptionMode.parse(p["preemption_mode"], name)
        try:
            cfg = dataclasses.replace(base, **p)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"policy {name!r}: {e}") from e
        return UnifiedScheduler(name, cfg)

    return factory


# InferMax Table 1, P column: vLLM-style presets use P = C (None).
_PRESETS: dict[str, tuple[UnifiedConfig, str]] = {
    "vllm": (
        UnifiedConfig("prefill-first", hybrid=False, chunked_prefill=False),
        "vLLM: prefill priority, no hybrid, no chunking",
    ),
    "sarathi": (
        UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True, prefill_tokens=512),
        "Sarathi-Serve: decode priority, hybrid batches, chunked prefill P=512",
    ),
    "sarathi-p=c": (
        UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True),
        "Sarathi with P = C",
    ),
    "sarathi-nocp": (
        UnifiedConfig("decode-first", hybrid=True, chunked_prefill=False),
        "Sarathi without chunked prefill",
    ),
    "vllm-hy": (
        UnifiedConfig("prefill-first", hybrid=True, chunked_prefill=False),
        "vLLM with hybrid batching",
    ),
    "sarathi-nohy": (
        UnifiedConfig("decode-first", hybrid=False, chunked_prefill=False),
        "Sarathi without hybrid batching or chunking",
    ),
}

for _name, (_cfg, _summary) in _PRESETS.items():
    register(_name, _unified(_name, _cfg), _summary)
    register(
        f"{_name}-ef",
        _unified(f"{_name}-ef", dataclasses.replace(_cfg, eviction_free=True, evict=False)),
        f"{_summary}; eviction-free (reserves I+O-1 per request)",
    )

register(
    "edf",
    _unified(
        "edf",
        UnifiedConfig(
            "single",
            hybrid=True,
            chunked_prefill=True,
            prefill_tokens=512,
            order="edf",
            evict_for_waiting=True,
        ),
    ),
    "earliest deadline first over all requests (Sarathi batching, preemptive)",
)
register(
    "rank-input",
    _unified(
        "rank-input",
        UnifiedConfig(
            "single",
            hybrid=True,
            chunked_prefill=True,
            prefill_tokens=512,
            order="input",
            evict_for_waiting=True,
        ),
    ),
    "InferMax A.3: shortest input first (Sarathi batching, preemptive)",
)
register(
    "rank-output",
    _unified(
        "rank-output",
        UnifiedConfig(
            "single",
            hybrid=True,
            chunked_prefill=True,
            prefill_tokens=512,
            order="output",
            evict_for_waiting=True,
        ),
    ),
    "InferMax A.3: shortest predicted output first (Sarathi batching, preemptive)",
)


def _andes(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.andes import make_andes

    return make_andes(params)


def _lqsf(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.andes import make_lqsf

    return make_lqsf(params)


register("andes", _andes, "Andes: QoE-aware token-level preemptive scheduling (knapsack, refiner)")
register("lqsf", _lqsf, "Least QoE Slack First (Andes §6.1 baseline)")


def _rr(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.rr import make_rr

    return make_rr(params)


def _bros(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.bros import make_bros

    return make_bros(params)


def _bros_nobicache(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.bros import make_bros

    return make_bros({"bidirectional": False, **params}, name="bros-nobicache")


register("rr", _rr, "BROS §2.2 round-robin: RT and BE FCFS queues alternate per iteration")
register(
    "bros",
    _bros,
    "BROS: RT by residual time to the token deadline, BE packing, bidirectional KV blocks",
)
register(
    "bros-nobicache",
    _bros_nobicache,
    "BROS without bidirectional KV blocks (recompute instead; §7.4.1 ablation)",
)
