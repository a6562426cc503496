"""Chunk runs (``engine/chunk_run.py``) on the prefix-caching manager change nothing but
the number of policy decisions: tokens, iteration ends, trace rows, busy time, and the
cache itself — registrations, evictions (with a CPU tier), hits, the hit log, reference
counts, and what a router's peek sees at any instant mid-run — are those of the engine
without them, for prompts that start after cached tokens too."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import count_schedule_calls, drive, outcome, small_linear_cost
from sloserve.core.errors import SchedulerViolation
from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request
from sloserve.costmodel.base import ConstantCostModel
from sloserve.engine import chunk_run
from sloserve.engine.env import Environment
from sloserve.engine.instance import Instance
from sloserve.engine.interface import Limits
from sloserve.engine.prefix_cache import PrefixCachingKVManager
from sloserve.policies.registry import make_policy

SRC = 8  # tokens per identity block (a unit is two 4-token blocks)


def _ids(i: int, prompt: int, family: int, shared: int) -> tuple[int, ...]:
    """A prompt's identity: its family's blocks up to ``shared``, then its own."""
    n = -(-prompt // SRC)
    return tuple(family * 1000 + j if j < shared else 10**6 + i * 1000 + j for j in range(n))


def _simulate(
    setup: dict[str, Any],
    spec: list[tuple[float, int, int, int, int]],
    *,
    chains: bool = True,
    probes: list[float] = (),  # type: ignore[assignment]
    aborts: list[tuple[float, int]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """One run on a prefix-caching replica; ``chains`` False: no chunk runs (as before)."""
    params = {"groups": setup["groups"], "hybrid": setup["hybrid"], "watermark": 0.0}
    sched = make_policy("sarathi", params)
    if not chains:
        sched.repeats_final_chunk = sched.repeats_joined_chunk = False
    bs = 4
    blocks = setup["M"] // bs
    limits = Limits(setup["C"], min(setup["P"], setup["C"]), blocks * bs, setup["R_max"], bs)
    kv = PrefixCachingKVManager(
        blocks, bs, 64, cpu_cache_blocks=setup["cpu_cache"], source_block_tokens=SRC
    )
    cost = small_linear_cost() if setup["cost"] == "linear" else ConstantCostModel(0.01)
    env = Environment()
    inst = Instance(
        env, sched, cost, limits, make_predictor("oracle"), kv=kv, check_invariants=True
    )
    decisions = count_schedule_calls(sched)
    reqs = [
        Request(i, a, p, o, hash_ids=_ids(i, p, fam, shared))
        for i, (a, p, o, fam, shared) in enumerate(sorted(spec))
    ]
    seen: list[tuple[float, list[int], int]] = []

    def probe() -> None:  # what an exact prefix scorer reads mid-run
        peeks = [kv.peek_prefix(r.hash_ids or (), r.num_prompt_tokens) for r in reqs]
        seen.append((env.now, peeks, kv.registered))

    drive(
        inst,
        reqs,
        cut=setup["cut"],
        horizon=setup["horizon"],
        probe=probe,
        probes=probes,
        aborts=aborts,
    )
    return {
        **outcome(inst, reqs),
        "cached": [r.num_cached_tokens for r in reqs],
        "kv": (kv.num_used_blocks, kv.num_cached_blocks, kv.reference_counts()),
        "cache": (
            kv.registered,
            kv.lookup_tokens,
            kv.hit_tokens_gpu,
            kv.hit_tokens_cpu,
            kv.evicted_units,
            kv.released_tokens,
            list(kv.hit_log),
            list(kv._host),
        ),
        "probes": seen,
        "decisions": decisions[0],
    }


workloads = st.lists(
    st.tuples(
        st.floats(0, 0.8),
        st.integers(1, 200),
        st.integers(1, 30),
        st.integers(0, 2),  # family
        st.integers(0, 25),  # blocks shared with the family
    ),
    min_size=1,
    max_size=12,
)
setups = st.fixed_dictionaries(
    {
        "groups": st.sampled_from(["decode-first", "prefill-first"]),
        "hybrid": st.booleans(),
        "cost": st.sampled_from(["constant", "linear"]),
        "M": st.integers(120, 800),
        "C": st.integers(24, 256),
        "P": st.integers(4, 48),
        "R_max": st.integers(1, 8),
        "cpu_cache": st.sampled_from([0, 16, 64]),
        "cut": st.booleans(),
        # Always a horizon: a tiny cache can thrash without end, chunk runs or not (recompute
        # preemptions and queued requests' held prefixes; 120 tokens of KV, R_max 3: the
        # clock passed 1,800 s in both engines).
        "horizon": st.floats(0.05, 2.0),
    }
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=workloads,
    setup=setups,
    probes=st.lists(st.floats(0, 1.5), max_size=12),
    aborts=st.lists(st.tuples(st.floats(0, 1.0), st.integers(0, 11)), max_size=2),
)
def test_chunk_runs_on_the_prefix_cache_change_only_the_decisions(
    spec: list[tuple[float, int, int, int, int]],
    setup: dict[str, Any],
    probes: list[float],
    aborts: list[tuple[float, int]],
) -> None:
    on = _simulate(setup, spec, probes=probes, aborts=aborts)
    off = _simulate(setup, spec, chains=False, probes=probes, aborts=aborts)
    assert on.pop("decisions") <= off.pop("decisions")
    assert on == off


# Two decoding requests, then a 120-token prompt whose first 48 tokens (six units) a
# finished request left cached, in 16-token chunks: it joins at token 48, takes middle
# chunks and a final one; a probe peeks at its prompt during the chain.
_SETUP = {
    "groups": "decode-first",
    "hybrid": True,
    "cost": "linear",
    "M": 4000,
    "C": 256,
    "P": 16,
    "R_max": 8,
    "cpu_cache": 0,
    "cut": True,
    "horizon": None,
}
_SPEC = [(0.0, 60, 1, 1, 6), (0.3, 4, 80, 0, 0), (0.3, 4, 80, 0, 0), (0.4, 120, 5, 1, 15)]


def _probes() -> list[float]:
    tr = _simulate(_SETUP, _SPEC, chains=False)["trace"]
    joined = next(i for i, t in enumerate(tr["time"]) if t >= 0.4)  # the prompt's join
    t0, t1 = tr["time"][joined], tr["time"][joined + 2] + tr["duration"][joined + 2]
    return [t0 + (t1 - t0) * f for f in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99)]


def test_a_cached_prompt_chains_from_its_joining_chunk() -> None:
    probes = _probes()
    on = _simulate(_SETUP, _SPEC, probes=probes)
    off = _simulate(_SETUP, _SPEC, chains=False, probes=probes)
    assert on["cached"][3] == 48  # it found six units cached
    assert off["decisions"] - on["decisions"] >= 2  # join, middle run, final: one decision
    on.pop("decisions"), off.pop("decisions")
    assert on == off
    # the probes saw the prompt's units registered as its chunks ended
    assert len({peeks[3] for _t, peeks, _n in on["probes"]}) >= 3


def test_registering_at_the_chain_end_only_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The equality has teeth: without the registrations at each phase's end a router's
    # peek mid-chain sees fewer cached units than the single steps left.
    probes = _probes()
    off = _simulate(_SETUP, _SPEC, chains=False, probes=probes)
    monkeypatch.setattr(chunk_run, "_register_ended", lambda kv, req, n, k: None)
    bad = _simulate(_SETUP, _SPEC, probes=probes)
    assert bad["probes"] != off["probes"]


def test_a_decode_still_registering_in_a_chain_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # A chain registers only its prompt's units (_register_ended): the debug checks catch a
    # batch whose other entries could still register some.
    real = chunk_run.advance
    seen: list[int] = []

    def tainted(inst: Instance, pending: Any) -> None:
        final = pending.final
        if final is not None and final.decode_ids and not seen:
            seen.append(final.decode_ids[0])
            inst.kv._open[final.decode_ids[0]] = 1 << 40  # type: ignore[attr-defined]
        real(inst, pending)

    monkeypatch.setattr(chunk_run, "advance", tainted)
    with pytest.raises(SchedulerViolation, match="an entry besides its prompt registers"):
        _simulate(_SETUP, _SPEC)
    assert seen


def test_a_cached_prompt_priced_from_token_zero_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # ... and a chain priced as if the prompt started at token 0 (its cached context
    # ignored) moves the iteration ends.
    off = _simulate(_SETUP, _SPEC, chains=False)
    real = chunk_run._final_end

    def from_zero(
        inst: Instance, start: float, rest: int, done: int, stats: Any, before: int
    ) -> float | None:
        return real(inst, start, rest, done - 48, stats, before)

    monkeypatch.setattr(chunk_run, "_final_end", from_zero)
    bad = _simulate(_SETUP, _SPEC)
    assert bad["iter_end"] != off["iter_end"]


@pytest.mark.parametrize(
    "cluster",
    [
        {"replicas": [{"count": 3}], "router": "prefix-affinity"},  # peeks every replica
        {"replicas": [{"count": 3}], "router": "round-robin"},
        {
            "replicas": [{"count": 3}],
            "router": "prefix-load",
            "router_params": {"kv_weight": 1.0},  # reads progress: every event stops runs
        },
        {
            "replicas": [{"count": 3}],
            "router": "prefix-affinity",
            "failures": [{"replica": 1, "at_s": 6.0, "recover_s": 9.0}],
        },
    ],
)
def test_cluster_runs_with_prefix_caching_are_the_same_with_chunk_runs(
    cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np
    import pandas as pd

    import sloserve

    cfg = {
        "workload": {
            "mix": "sharegpt",
            "duration_s": 20,
            "arrival": {"kind": "poisson", "rate": 4.0},
            "prefix": {"system_prompt_tokens": 1500, "tenants": 4},
            "sessions": {"turns": {"mean": 4}, "think_time_s": 2},
        },
        "policy": "sarathi",
        "instance": {
            "max_running": 24,
            "chunk_size": 256,
            "kv_capacity_tokens": 12_000,
            "cpu_cache_gib": 0.5,
        },
        "cluster": cluster,
    }
    starts = [0]
    real = chunk_run.start_final

    def counted(inst: Instance, pending: Any) -> None:
        starts[0] += 1
        real(inst, pending)

    monkeypatch.setattr(chunk_run, "start_final", counted)
    on = sloserve.simulate(cfg)
    assert starts[0] > 0
    assert on.summary["prefix_hit_rate"] > 0.2 and on.summary["prefix_hit_tokens_cpu"] > 0
    monkeypatch.setattr(chunk_run, "eligible", lambda inst: False)
    off = sloserve.simulate(cfg)
    pd.testing.assert_frame_equal(on.table, off.table)
    pd.testing.assert_frame_equal(on.trace, off.trace)
    for i, ends in off.iter_ends.items():
        np.testing.assert_array_equal(on.iter_ends[i], ends)
    drop = {"wall_seconds"}
    assert {k: v for k, v in on.summary.items() if k not in drop} == {
        k: v for k, v in off.summary.items() if k not in drop
    }
