"""The run's collector setting (``experiments/gc_freeze.py``): what existed before is out
of the collector's passes during the run and back afterwards; cycles made during the run
are still freed; a simulation's result does not depend on it."""

import gc
import weakref

import pytest

from sloserve.experiments.gc_freeze import frozen


class _Node:
    def __init__(self) -> None:
        self.other: object = self


def test_frozen_during_the_block_and_unfrozen_after_even_on_error() -> None:
    gc.unfreeze()
    before = [_Node() for _ in range(10)]
    with frozen():
        assert gc.get_freeze_count() >= len(before)
    assert gc.get_freeze_count() == 0
    try:
        with frozen():
            raise RuntimeError("a run that fails")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0


def test_a_cycle_made_and_dropped_during_the_run_is_still_collected() -> None:
    with frozen():
        n = _Node()
        ref = weakref.ref(n)
        del n
        gc.collect()
        assert ref() is None


def test_a_simulation_gives_the_same_summary_with_and_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import contextlib

    import sloserve
    from sloserve.experiments import runner

    cfg = {"policy": "vllm", "workload": {"mix": "sharegpt", "num_requests": 200,
                                          "duration_s": None, "seed": 3}}  # fmt: skip
    a = sloserve.simulate(cfg).summary
    monkeypatch.setattr(runner, "frozen", contextlib.nullcontext)
    b = sloserve.simulate(cfg).summary
    for s in (a, b):
        s.pop("wall_seconds")
    assert a == b
