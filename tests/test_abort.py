"""Aborting one request (a client disconnect): its KV is freed, it ends exactly once, and a
request in the iteration in flight is aborted when that iteration ends."""

from __future__ import annotations

from helpers import make_instance, req
from sloserve.core.request import RequestStatus
from sloserve.costmodel.base import ConstantCostModel
from sloserve.engine.env import PRIO_ARRIVAL


def test_abort_waiting_running_and_in_flight() -> None:
    inst = make_instance("vllm", M=1000, R_max=1, multi_step=False)
    a, b = req(0, 0.0, 10, 100), req(1, 0.0, 10, 5)
    for r in (a, b):
        inst.env.schedule(0.0, lambda r=r: inst.add_request(r), PRIO_ARRIVAL)
    inst.env.run(until=0.035)  # a prefilled and decoding (R_max=1), b waiting
    assert a.status is RequestStatus.RUNNING and b.status is RequestStatus.WAITING
    assert inst.abort(b)  # waiting: at once
    assert b.status is RequestStatus.ABORTED and b not in inst.waiting
    out_before = a.num_output_tokens
    assert inst.abort(a)  # in the batch in flight: when that iteration ends
    assert a.status is RequestStatus.RUNNING
    assert not inst.abort(b)  # already ended
    inst.env.run()
    assert a.status is RequestStatus.ABORTED
    assert a.num_output_tokens == out_before + 1  # the in-flight iteration's token counts
    assert inst.kv.num_used_blocks == 0
    inst.kv.check_invariants()
    assert [r.req_id for r in inst.done] == [1, 0]


def test_abort_swapped_frees_cpu_tier() -> None:
    # The golden swap scenario: b is swapped out at t=0.03 and back in at t=0.067.
    cost = ConstantCostModel(0.01, swap_s_per_token=0.001)
    inst = make_instance(
        "vllm", cost=cost, M=14, cpu_blocks=14, multi_step=False,
        params={"preemption_mode": "swap"},
    )
    a, b = req(0, 0.0, 5, 6), req(1, 0.0, 5, 6)
    for r in (a, b):
        inst.env.schedule(0.0, lambda r=r: inst.add_request(r), PRIO_ARRIVAL)
    inst.env.run(until=0.045)
    assert b.status is RequestStatus.PREEMPTED_SWAPPED
    assert inst.kv.cpu.used_blocks > 0  # type: ignore[attr-defined]
    assert inst.abort(b)
    assert b.status is RequestStatus.ABORTED and not inst.swapped
    assert inst.kv.cpu.used_blocks == 0  # type: ignore[attr-defined]
    inst.env.run()
    assert a.status is RequestStatus.FINISHED and inst.kv.num_used_blocks == 0
    assert not inst.abort(a)
