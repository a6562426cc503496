"""GetNextBatch specialised to Sarathi's shape (``policies/infermax/decode_first.py``) gives
the general path's output at every decision it answers, and hands the rest to it: random
runs of the decode-first presets with small KV caches (shortages, evictions, swaps, the
watermark, R_max), every fast answer compared with the general path's on the same view,
and whole runs with the fast path on and off compared request by request."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import (
    drive,
    make_drawn_instance,
    outcome,
    req,
    small_linear_cost,
    times,
)
from sloserve.core.errors import StallError
from sloserve.core.request import Request
from sloserve.engine.interface import InstanceView, SchedulerOutput
from sloserve.policies.infermax import decode_first
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler

_Key = tuple[Any, ...]


def _key(out: SchedulerOutput) -> _Key:
    return (
        tuple(out.batch),
        tuple(out.preempt),
        tuple(out.swap_in),
        out.repeatable,
        out.repeat_reserve_blocks,
    )


def _compared(monkeypatch: pytest.MonkeyPatch, seen: Counter[str]) -> None:
    """Make every fast answer be checked against the general path on the same view."""
    real = decode_first.schedule

    def both(
        sched: UnifiedScheduler, view: InstanceView, fillers: list[Request]
    ) -> SchedulerOutput | None:
        got = real(sched, view, fillers)
        if got is None:
            seen["general"] += 1
            return None
        seen["fast"] += 1
        sched._decode_first = False
        try:
            ref = UnifiedScheduler.schedule(sched, view)
        finally:
            sched._decode_first = True
        assert _key(got) == _key(ref)
        return got

    monkeypatch.setattr(decode_first, "schedule", both)


def _simulate(setup: dict[str, Any], spec: list[tuple[float, int, int]], *, fast: bool) -> Any:
    params = {
        "watermark": setup["watermark"],
        "preemption_mode": setup["mode"],
        "evict_for_waiting": setup["evict_for_waiting"],
        "evict": setup["evict"],
    }
    inst = make_drawn_instance(setup["policy"], setup, small_linear_cost(), params)
    sched = inst.scheduler
    assert isinstance(sched, UnifiedScheduler) and sched._decode_first
    sched._decode_first = fast
    reqs = [req(i, a, p, o) for i, (a, p, o) in enumerate(sorted(spec))]
    stalled = ""
    try:
        drive(inst, reqs, cut=setup["cut"], horizon=None)
    except StallError as e:  # (no eviction: a full cache may deadlock, alike on both paths)
        stalled = str(e)
    return {**outcome(inst, reqs), "stalled": stalled}, [times(inst, r) for r in reqs]


workloads = st.lists(
    st.tuples(st.floats(0, 0.8), st.integers(1, 120), st.integers(1, 40)), min_size=1, max_size=14
)
setups = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(["sarathi", "sarathi-p=c", "sarathi-nocp"]),
        "watermark": st.sampled_from([0.0, 0.01, 0.1]),
        "mode": st.sampled_from(["recompute", "swap"]),
        "evict_for_waiting": st.booleans(),
        "evict": st.booleans(),
        "M": st.integers(40, 600),
        # C below P as well as above, and the preset's own P (None: sarathi-p=c's P = C).
        "C": st.integers(16, 256),
        "P": st.one_of(st.none(), st.integers(4, 300)),
        "R_max": st.integers(1, 8),
        "block_size": st.sampled_from([1, 4, 16]),
        "cut": st.booleans(),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=workloads, setup=setups)
def test_the_fast_path_gives_the_general_paths_batches(
    spec: list[tuple[float, int, int]], setup: dict[str, Any]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _compared(mp, Counter())
        checked = _simulate(setup, spec, fast=True)
    on = _simulate(setup, spec, fast=True)
    off = _simulate(setup, spec, fast=False)
    for a, b in ((on, off), (checked, off)):
        assert a[0] == b[0]  # requests, iteration ends, trace rows, busy time
        for x, y in zip(a[1], b[1], strict=True):
            np.testing.assert_array_equal(x, y)


def test_both_paths_are_exercised(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tight KV cache: prompts join while others decode (the fast path), and decodes
    # outgrow the blocks, so the general path evicts (the fast path hands over).
    seen: Counter[str] = Counter()
    _compared(monkeypatch, seen)
    setup = {
        "policy": "sarathi",
        "watermark": 0.01,
        "mode": "recompute",
        "evict_for_waiting": False,
        "evict": True,
        "M": 96,
        "C": 256,
        "P": 32,
        "R_max": 8,
        "block_size": 4,
        "cut": True,
    }
    spec = [(0.01 * i, 20 + 7 * i, 30 + 3 * i) for i in range(10)]
    res, _ = _simulate(setup, spec, fast=True)
    assert seen["fast"] > 10 and seen["general"] > 0
    assert sum(r[6] for r in res["requests"]) > 0  # something was evicted


def test_only_where_its_steps_are_the_general_paths() -> None:
    def on(cfg: UnifiedConfig) -> bool:
        return UnifiedScheduler("x", cfg)._decode_first

    assert on(UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True))
    assert on(UnifiedConfig("decode-first", hybrid=True))
    assert not on(UnifiedConfig("decode-first", hybrid=False))  # phases never mix there
    assert not on(UnifiedConfig("prefill-first", hybrid=True))
    assert not on(UnifiedConfig("decode-first", hybrid=True, order="edf"))
    assert not on(UnifiedConfig("decode-first", hybrid=True, eviction_free=True))

    class Sub(UnifiedScheduler):  # its _groups or _key may differ: not specialised
        pass

    assert not Sub("s", UnifiedConfig("decode-first", hybrid=True))._decode_first
