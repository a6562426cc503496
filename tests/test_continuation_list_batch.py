"""A policy whose batch is a list it later mutates in place must still be
checked (the base tree raises SchedulerViolation at the same decision)."""

import pytest

from helpers import make_instance, req, run, small_linear_cost
from sloserve.core.errors import SchedulerViolation
from sloserve.engine.interface import ScheduledRequest, Scheduler, SchedulerOutput
from sloserve.policies.registry import make_policy


class ListPolicy(Scheduler):
    """vLLM, but each batch is handed over as a fresh list; at decision ``at`` it hands
    back its previous list, mutated in place (``mode``)."""

    def __init__(self, mode: str, at: int) -> None:
        self.inner = make_policy("vllm")
        self.name = "listy"
        self.default_prefill_tokens = self.inner.default_prefill_tokens
        self.chunked_prefill = self.inner.chunked_prefill
        self.mode, self.at, self.n = mode, at, 0
        self.last: list[ScheduledRequest] | None = None

    def max_sequence_tokens(self, limits):  # type: ignore[no-untyped-def]
        return self.inner.max_sequence_tokens(limits)

    def on_finish(self, r, t):  # type: ignore[no-untyped-def]
        return self.inner.on_finish(r, t)

    def schedule(self, view):  # type: ignore[no-untyped-def]
        out = self.inner.schedule(view)
        self.n += 1
        if self.n == self.at:
            old = self.last
            assert old
            if self.mode == "tokens":
                old[0] = ScheduledRequest(old[0].request, 3)  # a decode given 3 tokens
            else:
                old.append(old[0])  # a request twice
            return SchedulerOutput(old, repeatable=False)  # type: ignore[arg-type]
        self.last = list(out.batch)
        return SchedulerOutput(
            self.last,  # type: ignore[arg-type]
            out.preempt,
            out.swap_in,
            out.repeatable,
            out.repeat_reserve_blocks,
        )


@pytest.mark.parametrize("mode", ["tokens", "dup"])
def test_a_mutated_list_batch_is_still_checked(mode: str) -> None:
    reqs = [req(i, 0.05 * i, 20 + 7 * (i % 5), 6 + 3 * (i % 7)) for i in range(24)]
    inst = make_instance(ListPolicy(mode, 10), cost=small_linear_cost(), block_size=4, M=4000)
    inst.debug_checks = False  # the production default
    with pytest.raises(SchedulerViolation):
        run(inst, reqs)
