"""The KV manager a simulated replica gets (``experiments/kv_choice.py``): the plain paged
manager when no request can carry a prompt identity (identical results to the caching
manager, which is forced here for comparison), the caching manager whenever one can."""

from __future__ import annotations

from typing import Any

import pytest

import sloserve.experiments.cluster_run as cluster_run
import sloserve.experiments.runner as runner
from sloserve.cluster.config import ClusterConfig
from sloserve.core.request import Request
from sloserve.engine.kv import KVCacheManager, PagedKVManager
from sloserve.engine.prefix_cache import PrefixCachingKVManager
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.kv_choice import caching_asked, replica_kv
from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.workloads.identity import carries_prefix_identity
from sloserve.workloads.sessions import SessionPlan
from sloserve.workloads.spec import WorkloadSpec


def cfg(policy: str = "vllm", **workload: Any) -> SimConfig:
    """A small KV cache under load: preemptions happen, so the managers' counts matter."""
    base: dict[str, Any] = {
        "mix": "sharegpt",
        "num_requests": 160,
        "duration_s": None,
        "arrival": {"kind": "poisson", "rate": 40.0},
    }
    return SimConfig(
        workload=WorkloadSpec(**(base | workload)),
        instance=InstanceConfig(kv_capacity_tokens=6000, max_running=32),
        policy=policy,
    )


@pytest.fixture
def kv_types(monkeypatch: pytest.MonkeyPatch) -> list[type]:
    """Records the type of every replica's KV manager the runs below build."""
    seen: list[type] = []
    real = runner.replica_kv

    def spy(*a: Any, **k: Any) -> KVCacheManager:
        kv = real(*a, **k)
        seen.append(type(kv))
        return kv

    monkeypatch.setattr(runner, "replica_kv", spy)
    return seen


def force_caching(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caching manager whatever the workload (the behaviour before the choice)."""
    monkeypatch.setattr(runner, "carries_prefix_identity", lambda *_a: True)
    monkeypatch.setattr(cluster_run, "carries_prefix_identity", lambda *_a: True)


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    a, b = dict(a), dict(b)
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "andes"])
def test_no_identity_gets_the_plain_manager_with_identical_results(
    policy: str, kv_types: list[type], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cfg(policy)
    plain = simulate(c)
    assert kv_types == [PagedKVManager]
    assert plain.summary["preemptions"] > 0  # the managers were put to work
    force_caching(monkeypatch)
    cached = simulate(c)
    assert kv_types[1:] == [PrefixCachingKVManager]
    same(plain.summary, cached.summary)
    assert plain.table.equals(cached.table)
    # The summary says caching is on (it was asked for) and that nothing was looked up.
    assert plain.summary["prefix_caching"] is True
    assert plain.summary["prefix_lookup_tokens"] == 0


def test_cluster_no_identity_identical(
    kv_types: list[type], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cfg("sarathi", num_requests=240, arrival={"kind": "poisson", "rate": 80.0})
    cc = ClusterConfig.model_validate({"replicas": [{"count": 3}], "router": "least-outstanding"})
    plain = simulate_cluster(c, cc)
    assert set(kv_types) == {PagedKVManager}
    force_caching(monkeypatch)
    cached = simulate_cluster(c, cc)
    assert PrefixCachingKVManager in kv_types
    same(plain.summary, cached.summary)
    assert plain.table.equals(cached.table)
    assert plain.summary["prefix_caching"] is True


def test_caching_off_still_says_off(kv_types: list[type]) -> None:
    c = cfg()
    off = c.model_copy(update={"instance": c.instance.model_copy(update={"prefix_caching": False})})
    assert simulate(off).summary["prefix_caching"] is False
    assert kv_types == [PagedKVManager]


def test_shared_system_prompts_keep_the_caching_manager(kv_types: list[type]) -> None:
    c = cfg(prefix={"system_prompt_tokens": 1500, "tenants": 2})
    res = simulate(c)
    assert kv_types == [PrefixCachingKVManager]
    assert res.summary["prefill_tokens_saved"] > 0  # and it does hit


def test_sessions_keep_the_caching_manager(kv_types: list[type]) -> None:
    c = cfg(num_requests=20, sessions={"turns": {"mean": 3}, "think_time_s": 1.0})
    simulate_cluster(c, ClusterConfig.model_validate({"replicas": [{"count": 2}]}))
    assert kv_types and set(kv_types) == {PrefixCachingKVManager}


def test_identity_rule() -> None:
    plain = [Request(0, 0.0, 100, 10), Request(1, 0.0, 100, 10, hash_ids=())]
    assert not carries_prefix_identity(plain, None)
    assert carries_prefix_identity([*plain, Request(2, 0.0, 600, 10, hash_ids=(7,))], None)
    # Sessions create turns while the run goes: they count even before any exists.
    assert carries_prefix_identity([], SessionPlan())


def test_the_live_gateway_default_keeps_caching() -> None:
    """A caller that cannot list its requests (the gateway) does not pass the flag."""
    kv = replica_kv(
        None,
        caching=True,
        prefix_identities=True,
        num_blocks=8,
        block_size=16,
        cpu_blocks=0,
        cpu_cache_blocks=0,
    )
    assert isinstance(kv, PrefixCachingKVManager)
    import inspect

    default = inspect.signature(runner.build_instance).parameters["prefix_identities"].default
    assert default is True


def test_caching_asked() -> None:
    plain = PagedKVManager(8, 16, 0)
    assert caching_asked([plain], [True]) and not caching_asked([plain], [False])
    assert caching_asked([PrefixCachingKVManager(8, 16, 0)], [False])

    class Own(PagedKVManager):  # a policy's own manager is no stand-in
        pass

    assert not caching_asked([Own(8, 16, 0)], [True])
