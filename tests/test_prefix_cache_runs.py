"""Prefix caching in whole runs: outputs unchanged, off == on without shared prefixes,
the fast path equals single steps, and the real Mooncake trace (FAST '25, Apache-2.0)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import small_linear_cost
from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request
from sloserve.engine.env import PRIO_ARRIVAL, Environment
from sloserve.engine.instance import Instance
from sloserve.engine.interface import Limits
from sloserve.engine.prefix_cache import PrefixCachingKVManager
from sloserve.metrics.summary import request_table

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
COST = small_linear_cost()
POLICIES = ["vllm", "sarathi", "andes", "edf", "rr", "sarathi-ef", "vllm-hy", "bros-nobicache"]


def serve(
    spec: list[tuple[float, int, int, tuple[int, ...] | None]],
    *,
    caching: bool,
    policy: str = "vllm",
    blocks: int = 64,
    R_max: int = 4,
    multi_step: bool = True,
    cpu_cache: int = 0,
) -> tuple[Instance, list[Request]]:
    from sloserve.policies.registry import make_policy

    reqs = [Request(i, a, p, o, hash_ids=h) for i, (a, p, o, h) in enumerate(spec)]
    env = Environment()
    bs = 4
    limits = Limits(256, 256, blocks * bs, R_max, bs)
    kv = (
        PrefixCachingKVManager(blocks, bs, 16, cpu_cache_blocks=cpu_cache, source_block_tokens=8)
        if caching
        else None
    )
    inst = Instance(
        env,
        make_policy(policy),
        COST,
        limits,
        make_predictor("oracle"),
        kv=kv,
        cpu_swap_blocks=16,
        multi_step=multi_step,
        check_invariants=True,
    )
    for r in reqs:
        env.schedule(r.arrival, lambda r=r: inst.add_request(r), PRIO_ARRIVAL)
    env.run()
    return inst, reqs


def table(inst: Instance, reqs: list[Request]):  # type: ignore[no-untyped-def]
    import numpy as np

    return request_table(reqs, {0: np.asarray(inst.iter_end)})


arrivals = st.lists(
    st.tuples(st.floats(0, 2), st.integers(1, 60), st.integers(1, 30)), min_size=1, max_size=14
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=arrivals,
    # Andes also preempts for QoE, not only for memory: left out of this property.
    policy=st.sampled_from([p for p in POLICIES if p != "andes"]),
    cpu_cache=st.sampled_from([0, 8]),
)
def test_without_shared_prefixes_caching_on_is_bit_identical_to_off(
    spec: list[tuple[float, int, int]], policy: str, cpu_cache: int
) -> None:
    # Unique ids: blocks get cached (and evicted, the cache is smaller than the workload)
    # but never reused. R_max × the longest request fits, so nothing is preempted (a
    # preempted request would rightly reuse its own prefix when it is recomputed).
    unique = [(a, p, o, tuple(range(1000 * i, 1000 * i + 8))) for i, (a, p, o) in enumerate(spec)]
    off_i, off = serve(unique, caching=False, policy=policy, blocks=100)
    on_i, on = serve(unique, caching=True, policy=policy, blocks=100, cpu_cache=cpu_cache)
    assert off_i.num_preemptions == 0
    assert table(on_i, on).equals(table(off_i, off))
    assert on_i.iter_end == off_i.iter_end


shared_spec = st.lists(
    st.tuples(
        st.floats(0, 2),
        st.integers(1, 60),
        st.integers(1, 30),
        st.lists(st.integers(0, 2), min_size=1, max_size=8),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=shared_spec,
    policy=st.sampled_from(POLICIES),
    blocks=st.integers(16, 48),
    cpu_cache=st.sampled_from([0, 8]),
)
def test_shared_prefixes_change_times_never_outputs(
    spec: list[tuple[float, int, int, list[int]]], policy: str, blocks: int, cpu_cache: int
) -> None:
    # Few distinct ids: many prompts share prefixes; a tight cache forces evictions and
    # preemptions. Every request still ends with exactly its output (the engine checks
    # the KV invariants after every decision).
    shared = [(a, p, o, tuple(ids)) for a, p, o, ids in spec]
    _, off = serve(shared, caching=False, policy=policy, blocks=blocks)
    on_i, on = serve(shared, caching=True, policy=policy, blocks=blocks, cpu_cache=cpu_cache)
    assert [r.status for r in on] == [r.status for r in off]
    assert [r.num_output_tokens for r in on] == [r.num_output_tokens for r in off]
    assert all(r.num_cached_tokens < r.num_prompt_tokens for r in on)
    on_i.kv.check_invariants()
    # The fast path (many iterations at once) equals single steps with caching on.
    step_i, step = serve(
        shared, caching=True, policy=policy, blocks=blocks, cpu_cache=cpu_cache, multi_step=False
    )
    assert table(step_i, step).equals(table(on_i, on))


def test_reuse_on_a_multi_turn_prefix_lowers_ttft() -> None:
    # Turn 2 extends turn 1's prompt: it prefills only its new blocks.
    spec = [(0.0, 60, 5, (1, 2, 3, 4, 5, 6, 7, 8)), (5.0, 70, 5, (1, 2, 3, 4, 5, 6, 7, 8, 9))]
    on_i, on = serve(spec, caching=True)
    _, off = serve(spec, caching=False)
    assert on[1].num_cached_tokens == 56
    assert [h[1:] for h in on_i.kv.hit_log] == [(60, 0), (70, 56)]  # type: ignore[attr-defined]
    ttft = [(r.first_token_time or 0) - r.arrival for r in (on[1], off[1])]
    assert ttft[0] < ttft[1]


@pytest.mark.skipif(
    not (TRACE / "mooncake_conversation_trace.jsonl").exists(), reason="no shared traces"
)
def test_mooncake_conversation_minute_hits_and_saves_prefill() -> None:
    from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
    from sloserve.workloads.mooncake import load_mooncake

    df = load_mooncake(TRACE / "mooncake_conversation_trace.jsonl").df
    df = df[df.arrival_s < 20]
    reqs = [
        Request(i, float(a), int(p), int(o), hash_ids=h)
        for i, (a, p, o, h) in enumerate(
            zip(df.arrival_s, df.prompt_tokens, df.output_tokens, df.hash_ids, strict=True)
        )
    ]
    out = {}
    for pc in (False, True):
        cfg = SimConfig(
            policy="sarathi",
            instance=InstanceConfig(profile="llama-3.1-8b@h100", prefix_caching=pc),
        )
        out[pc] = simulate(cfg, reqs).summary
    assert out[False]["prefix_hit_rate"] == 0 and not out[False]["prefix_caching"]
    # An infinite cache would find this share of the prompt blocks (longest seen prefix).
    seen: set[tuple[int, ...]] = set()
    reuse = total = 0
    for h in df.hash_ids:
        k = 0
        while k < len(h) and h[: k + 1] in seen:
            k += 1
        reuse, total = reuse + k, total + len(h)
        seen.update(h[: j + 1] for j in range(len(h)))
    bound = reuse / total
    assert 0.5 * bound < out[True]["prefix_hit_rate"] <= 1.05 * bound
    assert out[True]["prefill_tokens_saved"] > 0
    assert out[True]["ttft_p50"] < out[False]["ttft_p50"]
    assert out[True]["finished"] == out[False]["finished"] == len(reqs)
