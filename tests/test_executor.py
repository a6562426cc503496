"""experiments.executor: one protocol, local processes (or in-process) and Ray; results in
input order and identical whichever backend ran them; rounds for searches."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import assert_user_error, run_main
from sloserve.core.errors import ConfigError
from sloserve.experiments.executor import (
    Executor,
    LocalExecutor,
    default_executor_name,
    make_executor,
    register_executor,
)


def square_slowly(x: int) -> int:
    # later items finish first, so that completion order differs from input order
    time.sleep(0.02 * (5 - x % 5))
    return x * x


def fail_from_three(x: int) -> int:
    if x >= 3:
        time.sleep(0.05 if x == 3 else 0.0)  # item 3 fails last
        raise ValueError(f"item {x} failed")
    return x


def meets_slo(rate: float) -> bool:
    """A stand-in for 'simulate at this rate and check attainment' (capacity 7.3 req/s)."""
    return rate <= 7.3


def bisect_capacity(ex: Executor, lo: float, hi: float, probes: int = 3) -> tuple[float, int]:
    """A k-section search that runs each round's probes in parallel, as the capacity
    planner will: the executor's submit_round/wait API is all it needs."""
    rounds = 0
    while hi - lo > 0.01:
        xs = [lo + (hi - lo) * k / (probes + 1) for k in range(1, probes + 1)]
        ok = ex.wait(ex.submit_round(meets_slo, xs))
        rounds += 1
        lo = max([lo] + [x for x, good in zip(xs, ok, strict=True) if good])
        hi = min([hi] + [x for x, good in zip(xs, ok, strict=True) if not good])
    return lo, rounds


@pytest.mark.parametrize("workers", [1, 2])
def test_map_returns_input_order_and_reports_each_task_once(workers: int) -> None:
    seen: list[tuple[int, int]] = []
    with LocalExecutor(workers) as ex:
        out = ex.map(square_slowly, list(range(8)), on_done=lambda k, r: seen.append((k, r)))
    assert out == [x * x for x in range(8)]
    assert sorted(seen) == [(k, k * k) for k in range(8)]
    if workers == 1:  # in process, serially: completion order is input order
        assert [k for k, _ in seen] == list(range(8))


def test_serial_and_processes_agree_with_cost_ordering() -> None:
    items = list(range(10))
    with LocalExecutor(1) as a, LocalExecutor(2) as b:
        assert a.map(square_slowly, items) == b.map(square_slowly, items, cost=lambda x: x)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_lowest_index_failure_is_raised_whatever_the_timing(workers: int) -> None:
    with LocalExecutor(workers) as ex, pytest.raises(ValueError, match="item 3 failed"):
        ex.map(fail_from_three, list(range(6)))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bisection_submits_rounds_and_waits_for_them(workers: int) -> None:
    with LocalExecutor(workers) as ex:
        cap, rounds = bisect_capacity(ex, 0.5, 64.0)
    assert cap == pytest.approx(7.3, abs=0.01) and cap <= 7.3
    # each round of 3 probes cuts the interval to a quarter
    assert rounds == math.ceil(math.log(63.5 / 0.01, 4))  # = 7


def test_several_rounds_in_flight_are_waited_for_in_any_order() -> None:
    with LocalExecutor(2) as ex:
        r1 = ex.submit_round(square_slowly, [1, 2, 3])
        r2 = ex.submit_round(square_slowly, [4, 5])
        assert ex.wait(r2) == [16, 25]
        assert ex.wait(r1) == [1, 4, 9]
        with LocalExecutor(1) as other, pytest.raises(ValueError, match="another executor"):
            other.wait(r1)


def test_make_executor_names_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert default_executor_name() == "local"
    ex = make_executor(None, 3)
    assert isinstance(ex, LocalExecutor) and ex.workers == 3
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert default_executor_name() == "ray"
    with pytest.raises(ConfigError, match=r"unknown executor 'dask'; valid: local, ray"):
        make_executor("dask", 2)
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        LocalExecutor(0)
    register_executor("serial-test", lambda w: LocalExecutor(1))
    assert make_executor("serial-test", 8).workers == 1


def test_ray_executor_without_ray_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r"sloserve\[ray\]"):
        make_executor("ray", 2)


@pytest.mark.parametrize("paper", ["andes", "bros", "infermax"])
def test_reproduce_commands_take_executor_and_reject_unknown_names(
    paper: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from sloserve.cli import app

    assert "--executor" in CliRunner().invoke(app, ["reproduce", paper, "--help"]).stdout
    proc = run_main(
        monkeypatch,
        capsys,
        "reproduce",
        paper,
        "--quick",
        "--out",
        str(tmp_path),
        "--executor",
        "dask",
    )
    assert_user_error(proc, "unknown executor 'dask'; valid: local, ray")
