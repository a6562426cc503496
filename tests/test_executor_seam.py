"""The executor seam: the default cost-model executor leaves simulate bit-identical, and
an executor only reports durations (and end-of-sequence stops)."""

from __future__ import annotations

import pandas as pd
import pytest

from sloserve.core.errors import SchedulerViolation
from sloserve.core.request import RequestStatus
from sloserve.engine.executor import CostModelExecutor, ExecBatch
from sloserve.experiments.runner import InstanceConfig, SimConfig, simulate
from sloserve.workloads.spec import WorkloadSpec


def _cfg(policy: str) -> SimConfig:
    return SimConfig(
        workload=WorkloadSpec(mix="sharegpt", num_requests=60, seed=3),
        instance=InstanceConfig(profile="llama-2-7b-a100", kv_capacity_tokens=6000),
        policy=policy,
    )


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "andes", "bros"])
def test_default_executor_is_bit_identical(policy: str) -> None:
    cfg = _cfg(policy)
    base = simulate(cfg)
    from sloserve.costmodel.profile import load_profile

    explicit = simulate(
        cfg, executor=CostModelExecutor(load_profile(cfg.instance.profile).cost_model())
    )
    a = {k: v for k, v in base.summary.items() if k != "wall_seconds"}
    b = {k: v for k, v in explicit.summary.items() if k != "wall_seconds"}
    assert a == b
    pd.testing.assert_frame_equal(base.table, explicit.table)
    assert base.iter_end.tolist() == explicit.iter_end.tolist()


class _Recorder:
    """Steps every iteration at 10 ms, checks it changes nothing, may stop one request."""

    name = "recorder"
    fast_forward = False

    def __init__(self, stop: int | None = None, duration: float = 0.01) -> None:
        self.stop = stop
        self.duration = duration
        self.batches = 0
        self._stops: set[int] = set()

    def run(self, batch: ExecBatch) -> float:
        before = [(r.num_computed_tokens, r.num_output_tokens, r.status) for r, _ in batch.batch]
        self.batches += 1
        for r, n in batch.batch:
            # The KV manager already holds this iteration's tokens.
            assert batch.kv.num_tokens(r.req_id) >= r.num_computed_tokens + n
            emits = r.num_computed_tokens + n == r.num_prompt_tokens + r.num_output_tokens
            if r.req_id == self.stop and emits and r.num_output_tokens == 2:
                self._stops.add(r.req_id)
        after = [(r.num_computed_tokens, r.num_output_tokens, r.status) for r, _ in batch.batch]
        assert before == after
        return self.duration

    def take_stops(self) -> set[int]:
        out, self._stops = self._stops, set()
        return out


def test_custom_executor_steps_every_iteration_and_stops_on_eos() -> None:
    cfg = _cfg("vllm").model_copy(
        update={"workload": WorkloadSpec(mix="sharegpt", num_requests=8, seed=1)}
    )
    rec = _Recorder(stop=2)
    res = simulate(cfg, executor=rec)
    assert rec.batches == res.summary["iterations"]  # no fast-forwarded runs
    r2 = next(r for r in res.requests if r.req_id == 2)
    assert r2.status is RequestStatus.FINISHED and r2.num_output_tokens == 3
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)


def test_executor_must_report_a_positive_duration() -> None:
    cfg = _cfg("vllm").model_copy(
        update={"workload": WorkloadSpec(mix="sharegpt", num_requests=2, seed=1)}
    )
    with pytest.raises(SchedulerViolation, match="executor 'recorder'"):
        simulate(cfg, executor=_Recorder(duration=0.0))
