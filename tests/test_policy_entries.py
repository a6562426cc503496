"""InferMax's scheduler keeps one decode entry per running request: built when a prompt's
final chunk is scheduled, reused by every decode batch, dropped when the request ends."""

import pytest

from helpers import make_instance, req, run, small_linear_cost
from sloserve.policies.infermax.unified import UnifiedScheduler


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_decode_entries_are_reused_and_dropped(policy: str) -> None:
    reqs = [req(i, 0.03 * i, 20 + 9 * (i % 4), 2 + 5 * (i % 6)) for i in range(300)]
    inst = make_instance(policy, cost=small_linear_cost(), block_size=4, M=6000)
    sched = inst.scheduler
    assert isinstance(sched, UnifiedScheduler)
    seen: dict[int, object] = {}
    real = sched._decode_batch

    def watch(group):  # type: ignore[no-untyped-def]
        out = real(group)
        for e in out:  # one entry object per request, whichever decision built it
            assert seen.setdefault(e.request.req_id, e) is e
            assert e.num_tokens == 1
        return out

    sched._decode_batch = watch  # type: ignore[method-assign]
    run(inst, reqs)
    assert len(inst.done) == len(reqs) and seen
    assert not sched._decode_entries  # every request finished: no entry kept
