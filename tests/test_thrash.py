"""A preemption livelock is a clear error, not a simulation that never ends
(``engine/thrash.py``). The case is the review's: 49 Mooncake conversation requests
(FAST '25 trace, Apache-2.0, read from ../shared/traces) on one Sarathi replica whose KV
cache holds 3,000 tokens, swap preemption with no CPU tier, prefix caching: some requests
are preempted and re-admitted forever (without the check: minutes of CPU, gigabytes, no
end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sloserve.core.errors import StallError
from sloserve.engine import thrash
from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.workloads import WorkloadSpec

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces"
CONV = TRACE / "mooncake_conversation_trace.jsonl"


def _cfg(kv_tokens: int, horizon: float | None = None) -> SimConfig:
    return SimConfig(
        workload=WorkloadSpec(trace=str(CONV), trace_format="mooncake", num_requests=49),
        instance=InstanceConfig(
            max_running=24,
            chunk_size=512,
            kv_capacity_tokens=kv_tokens,
            block_size=4,
            cpu_swap_gib=0.0,
            prefix_caching=True,
        ),
        policy="sarathi",
        policy_params={"preemption_mode": "swap"},
        horizon_s=horizon,
    )


@pytest.mark.skipif(not CONV.exists(), reason="no shared traces")
def test_a_livelock_raises_a_stall_error_naming_it() -> None:
    with pytest.raises(StallError, match=r"preempted requests at 10000 decisions .* no request"):
        simulate(_cfg(3000))


@pytest.mark.skipif(not CONV.exists(), reason="no shared traces")
def test_a_horizon_ends_it_before_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    res = simulate(_cfg(3000, horizon=60.0))
    assert res.summary["preemptions"] > 500  # it thrashed, under the limit, and ended
    monkeypatch.setattr(thrash, "LIMIT", 50)  # the same run, a lower limit: caught
    with pytest.raises(StallError, match="preempted requests at 50 decisions"):
        simulate(_cfg(3000, horizon=60.0))
