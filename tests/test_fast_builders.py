"""The engine's positional builders of its two per-decision frozen dataclasses give
objects equal in every way to the dataclasses' own constructors."""

import dataclasses
import pickle

import pytest

from sloserve.core.request import Request
from sloserve.costmodel.base import BatchStats, batch_stats
from sloserve.engine.interface import (
    PreemptionMode,
    ScheduledRequest,
    SchedulerOutput,
    scheduler_output,
)


def test_batch_stats_equals_the_constructor() -> None:
    for args in [(1, 2, 3, 4, 5), (0, 0, 0, 7, 90, 11)]:
        fast, slow = batch_stats(*args), BatchStats(*args)
        assert type(fast) is BatchStats
        assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
        assert dataclasses.astuple(fast) == dataclasses.astuple(slow)
        assert pickle.loads(pickle.dumps(fast)) == slow
        assert fast.total_tokens == slow.total_tokens
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.num_decode = 3  # type: ignore[misc]


def test_scheduler_output_equals_the_constructor() -> None:
    r = Request(req_id=1, arrival=0.0, num_prompt_tokens=5, true_output_len=3)
    q = Request(req_id=2, arrival=0.0, num_prompt_tokens=5, true_output_len=3)
    args = ((ScheduledRequest(r, 5),), ((q, PreemptionMode.SWAP),), (), True, 4)
    fast, slow = scheduler_output(*args), SchedulerOutput(*args)
    assert type(fast) is SchedulerOutput and fast == slow and repr(fast) == repr(slow)
    assert dataclasses.replace(fast, repeatable=False) == dataclasses.replace(
        slow, repeatable=False
    )
    assert not fast.empty
    with pytest.raises(ValueError, match="repeat_reserve_blocks"):
        scheduler_output((), (), (), False, -1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.repeatable = False  # type: ignore[misc]
