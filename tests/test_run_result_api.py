"""RunResult keeps its public constructor, pickles, and still builds its tables lazily."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pandas as pd
from pandas.testing import assert_frame_equal

from sloserve.experiments.runner import RunResult, SimConfig, simulate
from sloserve.workloads import ConstantArrivals, WorkloadSpec


def _cfg() -> SimConfig:
    return SimConfig(
        workload=WorkloadSpec(num_requests=30, arrival=ConstantArrivals(rate=8.0), seed=3)
    )


def test_keyword_construction_with_table_and_trace() -> None:
    res = simulate(_cfg())
    table, trace = pd.DataFrame({"a": [1]}), pd.DataFrame({"b": [2]})
    made = RunResult(
        config=res.config,
        requests=res.requests,
        table=table,
        summary=res.summary,
        trace=trace,
        iter_end=res.iter_end,
    )
    assert made.table is table and made.trace is trace


def test_pickle_round_trip_keeps_both_tables() -> None:
    res = simulate(_cfg())
    back = pickle.loads(pickle.dumps(res))
    assert_frame_equal(back.table, res.table)
    assert_frame_equal(back.trace, res.trace)
    assert back.summary == res.summary
    assert "kv_usage" in back.trace.columns and len(back.trace) > 0


def test_tables_stay_lazy_until_read() -> None:
    code = (
        "import sys\n"
        "from sloserve.experiments.runner import SimConfig, simulate\n"
        "from sloserve.workloads import ConstantArrivals, WorkloadSpec\n"
        "res = simulate(SimConfig(workload=WorkloadSpec(num_requests=20,"
        " arrival=ConstantArrivals(rate=8.0), seed=3)))\n"
        "assert 'pandas' not in sys.modules, 'pandas before any table was read'\n"
        "assert len(res.trace) > 0 and 'pandas' in sys.modules\n"
        "assert len(res.table) == 20\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
