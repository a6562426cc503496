"""Screening: a search on the first part of the window, then the whole window from its
answer. Only whole-window runs decide, so the answer is the one a direct search finds."""

from __future__ import annotations

import math
from typing import Any

import pytest

import sloserve
from sloserve.core.errors import ConfigError
from sloserve.experiments.capacity.planner import SCREEN_MIN_S, screen_window
from sloserve.experiments.capacity.search import FewestSearch, run_searches
from sloserve.experiments.executor import LocalExecutor
from test_capacity import _base  # 10 ms steps, 10 outputs, one request per replica


def test_the_window_is_cut_only_when_long_enough() -> None:
    long = _base(1.0, 400.0)
    cut = screen_window(long, 0.25)
    assert cut is not None and cut["workload"]["duration_s"] == 100.0
    assert long["workload"]["duration_s"] == 400.0  # the base is not changed
    assert screen_window(_base(1.0, SCREEN_MIN_S - 1), 0.25) is None
    assert screen_window(long, None) is None and screen_window(long, 0) is None
    counted = _base(1.0, 400.0)
    counted["workload"]["num_requests"] = 100
    assert screen_window(counted, 0.25) is None
    with pytest.raises(ConfigError, match="--screen"):
        screen_window(long, 1.5)


def _threshold(item: tuple[int, float]) -> bool:
    need, x = item
    return x >= need


@pytest.mark.parametrize("guess", [3, 9, 10, 11, 20])
@pytest.mark.parametrize("k", [1, 2])
def test_a_guess_starts_the_search_and_never_changes_the_answer(guess: int, k: int) -> None:
    s = FewestSearch("a", 1, 64, 1, guess=guess)
    assert s.propose(k) == [guess - 1, guess]  # the guess and the count below it
    with LocalExecutor(1) as ex:
        run_searches([s], lambda _s, x, _seed: (10, x), _threshold, bool, ex, k=k)
    assert s.answer == 10 and s.neighbour == 9 and not s.violations()
    if guess == 10:
        assert len(s.visited) == 2  # a right guess costs two runs
    # a guess one off costs a few more, never a doubling's overshoot
    assert max(s.visited) <= max(guess, math.floor(9 * 1.25) + k)


def test_screening_finds_the_same_minimum_as_a_direct_search(const_profile: str) -> None:
    rate = 45.0
    kw: dict[str, Any] = dict(
        slo="ttft=50ms",
        attainment=0.99,
        profiles=[const_profile],
        routers="round-robin",
        policies="vllm",
        rates=[rate],
        seeds=[0],
        workers=1,
    )
    base = _base(rate, 240.0)
    direct = sloserve.plan_capacity(base, screen=None, **kw)
    screened = sloserve.plan_capacity(base, **kw)
    assert int(direct.answers["replicas"][0]) == math.ceil(rate * 0.1) == 5
    assert int(screened.answers["replicas"][0]) == 5
    assert int(screened.answers["neighbour_replicas"][0]) == 4
    probes = screened.probes
    assert probes["screen"].any() and not direct.probes["screen"].any()
    # the whole-window runs of the screened search: the guess and the count below it
    full = probes[~probes["screen"]]
    assert sorted(full["replicas"]) == [4, 5]
    assert screened.settings["screen_window_s"] == 60.0


def test_a_probe_on_a_cached_workload_is_the_probe_on_a_built_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sloserve.experiments.capacity import probe as probe_mod
    from sloserve.experiments.capacity.probe import Probe, run_probe
    from sloserve.experiments.capacity.slo import parse_slo
    from sloserve.experiments.capacity.space import Arm

    base = {"workload": {"arrival": {"kind": "poisson", "rate": 6}, "duration_s": 30}}
    arm = Arm("llama-2-7b-a40", "least-loaded", "vllm")
    targets = parse_slo("ttft_p90=500ms,tpot_p90=50ms")

    def fields(n: int, stop: bool) -> tuple[Any, ...]:
        r = run_probe(Probe(base, arm, n, 6.0, 1, targets, 0.9, early_stop=stop))
        # repr: a stopped run's gpu_seconds is nan, which equals nothing
        return (
            r.passes,
            repr(r.attainment),
            r.stopped_at_s,
            r.requests,
            repr(r.gpu_seconds),
            r.shares,
        )

    probe_mod._built.cache_clear()
    cached = [fields(n, s) for n in (1, 2) for s in (True, False)]
    assert probe_mod._built.cache_info().hits >= 3  # one build, reused
    monkeypatch.setattr(probe_mod, "_workload", lambda _cfg: None)
    built = [fields(n, s) for n in (1, 2) for s in (True, False)]
    assert cached == built
