"""``Replica.kv_usage_mean`` in numpy gives the per-decision Python loop's floats."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.cluster.replica import Replica, ReplicaSpec


def loop_mean(incs: list[Any]) -> float | None:
    """The definition, one decision at a time (what the method did before)."""
    num = den = 0.0
    for inst in incs:
        nb = inst.kv.num_blocks
        for used, d in zip(inst.trace.kv_used_blocks, inst.trace.duration, strict=True):
            num += used / nb * d
            den += d
    return num / den if den > 0 else None


def incarnation(nb: int, used: list[int], dur: list[float]) -> Any:
    return SimpleNamespace(
        kv=SimpleNamespace(num_blocks=nb),
        trace=SimpleNamespace(kv_used_blocks=used, duration=dur),
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.integers(1, 5000).flatmap(
            lambda nb: st.tuples(
                st.just(nb),
                st.lists(
                    st.tuples(
                        st.integers(0, nb),
                        st.floats(0.0, 10.0, allow_nan=False, allow_subnormal=False),
                    ),
                    max_size=40,
                ),
            )
        ),
        max_size=4,
    )
)
def test_same_floats_as_the_loop(incs: list[tuple[int, list[tuple[int, float]]]]) -> None:
    built = [incarnation(nb, [u for u, _ in rows], [d for _, d in rows]) for nb, rows in incs]
    rep = Replica(ReplicaSpec(0, 0, "p", "vllm", "m", 0.0))
    rep.incarnations = built
    assert rep.kv_usage_mean() == loop_mean(built)


def test_long_trace() -> None:
    rng = np.random.default_rng(3)
    built = [
        incarnation(
            nb, rng.integers(0, nb, 50_000).tolist(), rng.exponential(0.05, 50_000).tolist()
        )
        for nb in (2767, 911)
    ]
    rep = Replica(ReplicaSpec(0, 0, "p", "vllm", "m", 0.0))
    rep.incarnations = built
    got = rep.kv_usage_mean()
    assert got is not None and got == loop_mean(built)
