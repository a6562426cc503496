"""Adversarial policies against the continuation that the new tests miss.

* a policy that reorders its batch at some decisions: the engine must not keep a
  continuation whose decodes ran in that step (results identical to no continuation);
* a policy that still schedules a request aborted while its decode run was in flight
  must raise SchedulerViolation (abort drops the continuation)."""

import pytest

from helpers import make_instance, req, run, small_linear_cost
from sloserve.core.errors import SchedulerViolation
from sloserve.engine import continuation
from sloserve.engine.interface import Scheduler, SchedulerOutput
from sloserve.policies.registry import make_policy


class Wrap(Scheduler):
    def __init__(self, policy: str) -> None:
        self.inner = make_policy(policy)
        self.name = "wrap"
        self.n = 0
        self.default_prefill_tokens = self.inner.default_prefill_tokens
        self.chunked_prefill = self.inner.chunked_prefill

    def max_sequence_tokens(self, limits):  # type: ignore[no-untyped-def]
        return self.inner.max_sequence_tokens(limits)

    def on_finish(self, r, t):  # type: ignore[no-untyped-def]
        return self.inner.on_finish(r, t)


class Reorder(Wrap):
    def __init__(self, policy: str, mode: str) -> None:
        super().__init__(policy)
        self.mode = mode

    def schedule(self, view):  # type: ignore[no-untyped-def]
        out = self.inner.schedule(view)
        self.n += 1
        b = out.batch
        if self.mode == "reverse" and self.n % 3 == 0 and len(b) > 1:
            return SchedulerOutput(tuple(reversed(b)), out.preempt, out.swap_in, False, 0)
        if self.mode == "rotate" and self.n % 2 == 0 and len(b) > 1:
            return SchedulerOutput(
                (*b[1:], b[0]), out.preempt, out.swap_in, out.repeatable, out.repeat_reserve_blocks
            )
        return out


def _signature(policy: str, mode: str, debug: bool):  # type: ignore[no-untyped-def]
    reqs = [req(i, 0.05 * i, 20 + 7 * (i % 5), 6 + 3 * (i % 7)) for i in range(40)]
    inst = make_instance(Reorder(policy, mode), cost=small_linear_cost(), block_size=4, M=4000)
    inst.debug_checks = debug
    run(inst, reqs)
    return [(r.req_id, r.finish_time, r.first_token_time, tuple(r.token_runs)) for r in reqs], list(
        inst.iter_end
    )


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
@pytest.mark.parametrize("mode", ["reverse", "rotate"])
def test_reordered_batches_give_the_results_without_the_continuation(
    policy: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _signature(policy, mode, debug=False)
    assert _signature(policy, mode, debug=True) == got  # continuation.verify at each decision
    monkeypatch.setattr(continuation, "lead", lambda _c, _b: 0)  # the base tree's checks
    monkeypatch.setattr("sloserve.engine.fastpath.continuation.lead", lambda _c, _b: 0)
    assert _signature(policy, mode, debug=False) == got


class Zombie(Wrap):
    """Re-issues its previous (all-decode) batch once a request in it was aborted."""

    def __init__(self) -> None:
        super().__init__("vllm")
        self.prev: tuple = ()
        self.victim = None
        self.fired = False

    def schedule(self, view):  # type: ignore[no-untyped-def]
        out = self.inner.schedule(view)
        if self.victim is not None and self.victim.status.is_terminal and not self.fired:
            self.fired = True
            return SchedulerOutput(self.prev, repeatable=False)
        self.prev = out.batch
        return out


def test_scheduling_a_request_aborted_in_flight_is_a_violation() -> None:
    reqs = [req(i, 0.0, 20, 60) for i in range(4)]
    sched = Zombie()
    inst = make_instance(sched, cost=small_linear_cost(), block_size=4, M=4000)
    inst.debug_checks = False

    def kill() -> None:
        sched.victim = reqs[2]
        inst.abort(reqs[2])

    inst.env.schedule(0.2, kill)
    with pytest.raises(SchedulerViolation):
        run(inst, reqs)
    assert sched.fired
