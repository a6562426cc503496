"""QLM's request eviction keeps what was generated (§5 of ``papers/qlm.txt``: "the
output tokens generated so far are appended to the input prompt ... the original prefill
and multiple decode steps are replaced by a single prefill step"): the per-replica agent
evicts by recompute, and an evicted request resumes from its generated tokens."""

from __future__ import annotations

import numpy as np

from helpers import make_instance, req, run, times
from sloserve.core.request import SLO, Request, RequestStatus


class Watched(Request):
    """Records (time, tokens generated, tokens to recompute) at each eviction."""

    seen: list[tuple[float, int, int]]

    def preempt_recompute(self, now: float) -> None:
        super().preempt_recompute(now)
        self.seen.append((now, self.num_output_tokens, self.remaining_compute))


def test_an_evicted_request_keeps_its_tokens_and_refills_prompt_plus_generated() -> None:
    # KV for 200 tokens: request 0 (50 + 100) runs alone; request 1 (100 + 20, deadline
    # 2 s) arrives at 0.3 s, does not fit beside it, and the EDF agent evicts request 0
    inst = make_instance("qlm", M=200, params={"state_swap": "off"})
    r0 = Watched(req_id=0, arrival=0.0, num_prompt_tokens=50, true_output_len=100,
                 slo=SLO(deadline_s=100.0))  # fmt: skip
    r0.seen = seen = []
    r1 = req(1, 0.3, 100, 20, slo=SLO(deadline_s=2.0))
    run(inst, [r0, r1])
    assert r0.status is RequestStatus.FINISHED and r1.status is RequestStatus.FINISHED
    assert seen, "request 0 was never evicted"
    at, kept, refill = seen[0]
    assert kept > 0 and refill == 50 + kept  # one prefill of prompt + generated
    t = times(inst, r0)
    assert len(t) == 100 and np.all(np.diff(t) > 0)  # no token generated twice
    assert t[kept - 1] <= at < t[kept]  # the first `kept` tokens were not redone
