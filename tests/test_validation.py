"""A policy can never corrupt the engine: every bad SchedulerOutput is a clear error."""

from collections.abc import Callable

import pytest

from helpers import make_instance, req, run
from sloserve.core.errors import SchedulerViolation, StallError
from sloserve.core.request import Request
from sloserve.engine.interface import (
    InstanceView,
    PreemptionMode,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)


class Scripted(Scheduler):
    """Returns whatever a function of the view says (once), then behaves."""

    name = "scripted"

    def __init__(self, fn: Callable[[InstanceView], SchedulerOutput]) -> None:
        self.fn = fn

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        return self.fn(view)


def first_waiting(view: InstanceView, n: int) -> SchedulerOutput:
    return SchedulerOutput((ScheduledRequest(view.waiting[0], n),))


CASES: list[tuple[str, Callable[[InstanceView], SchedulerOutput], dict, str]] = [
    ("C", lambda v: first_waiting(v, 100), {"C": 64, "P": 64}, "C (max batch tokens)"),
    ("P", lambda v: first_waiting(v, 40), {"C": 64, "P": 32}, "P (max prefill tokens)"),
    ("too many tokens", lambda v: first_waiting(v, 101), {}, "batch"),
    ("zero tokens", lambda v: first_waiting(v, 0), {}, "batch"),
    (
        "R_max",
        lambda v: SchedulerOutput(tuple(ScheduledRequest(r, 10) for r in v.waiting)),
        {"R_max": 1},
        "R_max (max running)",
    ),
    (
        "M",
        lambda v: SchedulerOutput(tuple(ScheduledRequest(r, 100) for r in v.waiting)),
        {"M": 150},
        "M (KV capacity)",
    ),
    (
        "duplicate",
        lambda v: SchedulerOutput(
            (ScheduledRequest(v.waiting[0], 1), ScheduledRequest(v.waiting[0], 1))
        ),
        {},
        "batch",
    ),
    (
        "preempt a waiting request",
        lambda v: SchedulerOutput(preempt=((v.waiting[0], PreemptionMode.RECOMPUTE),)),
        {},
        "preempt",
    ),
    (
        "swap in a waiting request",
        lambda v: SchedulerOutput(swap_in=(v.waiting[0],)),
        {},
        "swap_in",
    ),
    (
        "false repeatable promise",
        lambda v: SchedulerOutput((ScheduledRequest(v.waiting[0], 100),), repeatable=True),
        {},
        "repeatable",
    ),
]


@pytest.mark.parametrize(("label", "fn", "limits", "limit"), CASES, ids=[c[0] for c in CASES])
def test_violations_name_the_policy_and_the_limit(label: str, fn, limits: dict, limit: str) -> None:
    inst = make_instance(Scripted(fn), **{"M": 1000, **limits})
    r = Request(req_id=7, arrival=0.0, num_prompt_tokens=100, true_output_len=5)
    r2 = Request(req_id=8, arrival=0.0, num_prompt_tokens=100, true_output_len=5)
    with pytest.raises(SchedulerViolation) as e:
        run(inst, [r, r2])
    assert e.value.policy == "scripted"
    assert e.value.limit == limit
    assert "scripted" in str(e.value) and limit in str(e.value)


def test_a_policy_that_never_schedules_stalls_loudly() -> None:
    inst = make_instance(Scripted(lambda v: SchedulerOutput()))
    with pytest.raises(StallError, match="scripted"):
        run(inst, [req(0, 0.0, 10, 2)])


def test_scheduler_violation_pickles_across_processes() -> None:
    import pickle

    from sloserve.core.errors import SchedulerViolation

    e = SchedulerViolation("p", "C (max batch tokens)", "5000 > 4096")
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, SchedulerViolation)
    assert (back.policy, back.limit, back.detail, str(back)) == (e.policy, e.limit, e.detail, str(e))
