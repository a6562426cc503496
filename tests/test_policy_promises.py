"""Only ``UnifiedScheduler`` itself makes the engine's promises (``repeats_final_chunk``,
``repeats_joined_chunk``, ``repeats_decode_run``): they rest on its own ``schedule``,
``_groups``, ``_key`` and ``_decode_batch``, which a subclass may change, so a subclass's
own class attributes decide (the review's repro: a subclass that rotated its decode batch
and opted out with a class attribute still had the decode-run promise taken)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request
from sloserve.costmodel.base import ConstantCostModel
from sloserve.engine.env import PRIO_ARRIVAL, Environment
from sloserve.engine.instance import Instance
from sloserve.engine.interface import Limits, ScheduledRequest
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler

_FLAGS = ("repeats_final_chunk", "repeats_joined_chunk", "repeats_decode_run")
_SARATHI = UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True)


class _Rotating(UnifiedScheduler):
    """Rotates its decode batch each decision (a fairness tweak): not the promised order."""

    repeats_decode_run = False  # the author opts out ("leave it False when unsure")

    def __init__(self, name: str, config: UnifiedConfig) -> None:
        super().__init__(name, config)
        self.calls = 0

    def _decode_batch(self, group: Sequence[Request]) -> tuple[ScheduledRequest, ...]:
        self.calls += 1
        b = super()._decode_batch(group)
        k = self.calls % len(b)
        return b[k:] + b[:k]


class _OptIn(UnifiedScheduler):
    repeats_decode_run = True  # a subclass may promise on its own account


def test_the_class_itself_promises_where_its_proofs_hold() -> None:
    s = UnifiedScheduler("sarathi", _SARATHI)
    assert all(getattr(s, f) for f in _FLAGS)
    s.config = UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True, order="edf")
    assert not any(getattr(s, f) for f in _FLAGS)  # follows a replaced config


def test_a_subclass_gets_no_promise_from_the_base_class() -> None:
    assert not any(getattr(_Rotating("r", _SARATHI), f) for f in _FLAGS)
    s = _OptIn("o", _SARATHI)
    assert s.repeats_decode_run and not s.repeats_final_chunk
    s.config = _SARATHI  # a replaced config does not overwrite the subclass's choice
    assert s.repeats_decode_run


def test_a_subclass_that_opts_out_is_asked_at_every_decision() -> None:
    def run(sched: UnifiedScheduler) -> tuple[list[list[int]], list[int], int]:
        env = Environment()
        inst = Instance(
            env,
            sched,
            ConstantCostModel(0.01),
            Limits(4096, 4096, 10_000, 256, 1),
            make_predictor("oracle"),
            multi_step=False,
        )
        reqs = [
            Request(req_id=i, arrival=0.0, num_prompt_tokens=8, true_output_len=o)
            for i, o in enumerate([3, 10, 12])
        ]
        for r in reqs:
            env.schedule(0.0, functools.partial(inst.add_request, r), PRIO_ARRIVAL)
        env.run()
        runs = [list(r.token_runs) for r in reqs]
        return runs, [r.req_id for r in inst.done], len(inst.iter_end)

    rotating = _Rotating("r", UnifiedConfig("prefill-first"))
    runs, done, iterations = run(rotating)
    # Single steps: every decision after the prompts' iteration asked for a decode batch
    # (taking the promise skipped all but the first of them).
    assert iterations == 12 and rotating.calls == iterations - 1
    assert sorted(done) == [0, 1, 2] and all(runs)
