"""The policy registry: names -> factories. Unknown names fail with the list of valid ones.

Extension point: :func:`register` a factory ``(params: dict) -> Scheduler`` under a new
name; registering a name twice is an error. InferMax's unified-scheduler presets (vllm,
sarathi, edf, rank-*, …) come from :mod:`sloserve.policies.infermax.presets`; the other
papers' policies register lazy factories below (their modules load on first use).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sloserve.core.errors import ConfigError, UnknownNameError, did_you_mean
from sloserve.engine.interface import Scheduler
from sloserve.policies.infermax.presets import PRESETS

PolicyFactory = Callable[[Mapping[str, Any]], Scheduler]

_REGISTRY: dict[str, tuple[PolicyFactory, str]] = {}


def register(name: str, factory: PolicyFactory, summary: str) -> None:
    """Add a policy; names are unique."""
    if name in _REGISTRY:
        raise ConfigError(f"policy {name!r} is already registered")
    _REGISTRY[name] = (factory, summary)


def policy_names() -> list[str]:
    """The names :func:`make_policy` accepts, sorted (``sloserve policies`` lists them)."""
    return sorted(_REGISTRY)


def policy_summaries() -> dict[str, str]:
    return {n: _REGISTRY[n][1] for n in policy_names()}


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Scheduler:
    """Build a registered policy, overriding its preset parameters with ``params``."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UnknownNameError(
            f"unknown policy {name!r}{did_you_mean(name, policy_names())}; "
            f"valid: {', '.join(policy_names())}"
        )
    return entry[0](dict(params or {}))


for _name, _factory, _summary in PRESETS:
    register(_name, _factory, _summary)


def _andes(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.andes import make_andes

    return make_andes(params)


def _lqsf(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.andes import make_lqsf

    return make_lqsf(params)


register("andes", _andes, "Andes: QoE-aware token-level preemptive scheduling (knapsack, refiner)")
register("lqsf", _lqsf, "Least QoE Slack First (Andes §6.1 baseline)")


def _qlm(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.qlm import make_qlm_agent

    return make_qlm_agent(params)


register("qlm", _qlm, "QLM §5 agent: EDF pulls, eviction or GPU-CPU swap chosen by cost")


def _rr(params: Mapping[str, Any]) -> Scheduler:
    from sloserve.policies.bros import make_rr

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
