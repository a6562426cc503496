"""The engine's continuation (engine/continuation.py): a batch that starts with the running
decodes checked at the previous decision is checked only after them, yet every violation
is still caught, and runs are unchanged."""

from collections.abc import Callable

import pytest

from helpers import make_instance, req, run, small_linear_cost
from sloserve.core.errors import SchedulerViolation
from sloserve.core.request import Request, RequestStatus
from sloserve.engine import continuation
from sloserve.engine.instance import Instance
from sloserve.engine.interface import InstanceView, ScheduledRequest, Scheduler, SchedulerOutput
from sloserve.policies.registry import make_policy


class Tamper(Scheduler):
    """A real policy whose output is rewritten once, at the first decision where the
    instance holds a continuation and the batch starts with its entries."""

    def __init__(
        self, policy: str, rewrite: Callable[[SchedulerOutput, InstanceView], SchedulerOutput]
    ) -> None:
        self.inner = make_policy(policy)
        self.name = "tamper"
        self.rewrite = rewrite
        self.inst: Instance | None = None
        self.done = False
        self.need_tail = rewrite is _too_many_tokens_after_them
        self.default_prefill_tokens = self.inner.default_prefill_tokens
        self.chunked_prefill = self.inner.chunked_prefill

    def max_sequence_tokens(self, limits):  # type: ignore[no-untyped-def]
        return self.inner.max_sequence_tokens(limits)

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        out = self.inner.schedule(view)
        inst = self.inst
        assert inst is not None
        lead = continuation.lead(inst._cont, out.batch)
        if not self.done and lead and (len(out.batch) > lead or not self.need_tail):
            self.done = True
            return self.rewrite(out, view)
        return out


def workload() -> list[Request]:
    # Overlapping requests: decode runs end at finishes and arrivals, so the batch after a
    # run starts with the run's surviving decodes.
    return [req(i, 0.05 * i, 20 + 7 * (i % 5), 6 + 3 * (i % 7)) for i in range(24)]


def tampered(policy: str, rewrite: Callable[[SchedulerOutput, InstanceView], SchedulerOutput]):  # type: ignore[no-untyped-def]
    sched = Tamper(policy, rewrite)
    inst = make_instance(sched, cost=small_linear_cost(), block_size=4, M=4000)
    sched.inst = inst
    return inst, sched


def _dup_first(out: SchedulerOutput, _v: InstanceView) -> SchedulerOutput:
    return SchedulerOutput((*out.batch, out.batch[0]), repeatable=out.repeatable)


def _dup_first_step(out: SchedulerOutput, _v: InstanceView) -> SchedulerOutput:
    return SchedulerOutput((*out.batch, out.batch[0]), repeatable=False)


def _too_many_tokens_after_them(out: SchedulerOutput, _v: InstanceView) -> SchedulerOutput:
    r = out.batch[-1].request  # (the batch is longer than the checked decodes)
    n = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens + 1
    return SchedulerOutput((*out.batch[:-1], ScheduledRequest(r, n)), repeatable=False)


def _finished_one(out: SchedulerOutput, v: InstanceView) -> SchedulerOutput:
    done = [r for r in v.running if r.num_output_tokens >= r.true_output_len]
    extra = done or [Request(req_id=999, arrival=0.0, num_prompt_tokens=5, true_output_len=2)]
    return SchedulerOutput((*out.batch, ScheduledRequest(extra[0], 1)), repeatable=False)


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
@pytest.mark.parametrize(
    ("rewrite", "limit"),
    [
        (_dup_first, "batch"),
        (_dup_first_step, "batch"),
        (_too_many_tokens_after_them, "batch"),
        (_finished_one, "batch"),
    ],
    ids=[
        "duplicate, repeatable",
        "duplicate, single step",
        "too many tokens after them",
        "foreign",
    ],
)
def test_a_violation_after_the_checked_decodes_is_caught(policy: str, rewrite, limit: str) -> None:  # type: ignore[no-untyped-def]
    inst, sched = tampered(policy, rewrite)
    with pytest.raises(SchedulerViolation) as e:
        run(inst, workload())
    assert sched.done, "the continuation was never used: the test checks nothing"
    assert e.value.limit == limit


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_the_continuation_holds_its_invariant_and_is_used(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hits: list[int] = []
    real = continuation.lead

    def counting(cont, batch):  # type: ignore[no-untyped-def]
        n = real(cont, batch)
        hits.append(n)
        return n

    monkeypatch.setattr(continuation, "lead", counting)
    reqs = workload()
    inst = make_instance(policy, cost=small_linear_cost(), block_size=4, M=4000)
    inst.debug_checks = True  # continuation.verify at every decision
    # Aborts mid-run (one in a decode run, one queued) drop the continuation.
    inst.env.schedule(0.31, lambda: inst.abort(reqs[3]))
    inst.env.schedule(0.52, lambda: inst.abort(reqs[20]))
    run(inst, reqs)
    assert sum(1 for n in hits if n) >= 5
    assert len(inst.done) == len(reqs)


def test_verify_catches_a_stale_or_wrong_continuation() -> None:
    seen: list[continuation.Continuation] = []

    def keep(out: SchedulerOutput, _v: InstanceView) -> SchedulerOutput:
        assert sched.inst is not None and sched.inst._cont is not None
        continuation.verify(sched.inst)  # holds at the decision
        seen.append(sched.inst._cont)
        return out

    inst, sched = tampered("vllm", keep)
    run(inst, workload())
    assert seen
    cont = seen[0]
    inst._cont = continuation.Continuation(cont.entries, cont.ids, cont.ctx + 1, cont.left)
    with pytest.raises(AssertionError, match="not a running decode"):
        continuation.verify(inst)  # every request has finished since
    r = cont.entries[0].request
    inst.running.append(r)
    r.status = RequestStatus.RUNNING
    r.num_output_tokens -= 1  # a running decode again, one token short of its end
    r.num_computed_tokens -= 1
    good = continuation.Continuation((cont.entries[0],), [r.req_id], r.num_computed_tokens, 1)
    inst._cont = good
    continuation.verify(inst)
    for bad in (
        continuation.Continuation(good.entries, good.ids, good.ctx + 1, 1),  # context
        continuation.Continuation(good.entries, good.ids, good.ctx, 2),  # tokens left
    ):
        inst._cont = bad
        with pytest.raises(AssertionError, match="context"):
            continuation.verify(inst)
