"""The replay builds each request by position (``workloads/replay.py``): the fields it
passes must still be :class:`~sloserve.core.request.Request`'s first fields, in order,
and a replayed request must be the one built by keyword."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sloserve.core.request import QoESpec, Request
from sloserve.workloads.replay import REQUEST_FIELDS
from sloserve.workloads.spec import WorkloadSpec, build_requests


def test_request_fields_are_the_positions_the_replay_passes() -> None:
    names = [f.name for f in dataclasses.fields(Request)]
    assert tuple(names[: len(REQUEST_FIELDS)]) == REQUEST_FIELDS


def test_a_replayed_request_is_the_one_built_by_keyword(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens,class,priority,model,ttft_slo_s,qoe_ttft_s\n"
        "0.5,100,20,rt,,m1,,\n"
        "1.0,200,5,be,3,m2,2.5,0.75\n"
        "1.5,7,1,rt,,,,\n"
    )
    reqs = build_requests(WorkloadSpec(trace=str(trace)))
    assert len(reqs) == 3
    for r in reqs:
        again = Request(
            req_id=r.req_id,
            arrival=r.arrival,
            num_prompt_tokens=r.num_prompt_tokens,
            true_output_len=r.true_output_len,
            req_class=r.req_class,
            priority=r.priority,
            model=r.model,
            slo=r.slo,
            qoe=r.qoe,
            max_tokens=None,
            hash_ids=r.hash_ids,
        )
        assert dataclasses.astuple(again) == dataclasses.astuple(r)
    assert [r.priority for r in reqs][1] == 3 and reqs[1].model == "m2"
    assert reqs[1].slo.ttft_s == 2.5 and reqs[1].qoe == QoESpec(0.75, reqs[1].qoe.tokens_per_s)
    assert [r.num_prompt_tokens for r in reqs] == [100, 200, 7]
    assert [r.true_output_len for r in reqs] == [20, 5, 1]
    assert [r.arrival for r in reqs] == [0.5, 1.0, 1.5]
    assert reqs[0].slo is reqs[2].slo  # one shared spec per distinct target
