import math

import numpy as np
import pandas as pd
import pytest

from helpers import make_instance, req, run
from sloserve.core.request import SLO, QoESpec
from sloserve.metrics.summary import request_table, summarize


def test_per_request_metrics_and_slo_attainment() -> None:
    inst = make_instance("vllm", R_max=1)
    a = req(0, 0.0, 10, 3, slo=SLO(ttft_s=0.015, tpot_s=0.02), qoe=QoESpec(0.01, 100.0))
    b = req(1, 0.0, 10, 3, slo=SLO(ttft_s=0.015), qoe=QoESpec(0.01, 100.0))
    c = req(2, 0.0, 10, 3)  # no SLO: left out of attainment
    run(inst, [a, b, c])
    t = request_table([a, b, c], {0: np.asarray(inst.iter_end)}).set_index("req_id")
    assert t.loc[0, "ttft_s"] == pytest.approx(0.01)
    assert t.loc[0, "tpot_s"] == pytest.approx(0.01) == t.loc[0, "atgt_s"]
    assert t.loc[0, "e2e_s"] == pytest.approx(0.03)
    assert t.loc[0, "normalized_latency_s"] == pytest.approx(0.01)
    assert t.loc[0, "max_gap_s"] == pytest.approx(0.01)
    assert t.loc[1, "ttft_s"] == pytest.approx(0.04)  # head-of-line blocked
    assert t.loc[1, "queue_s"] == pytest.approx(0.03)
    assert (t.loc[0, "slo_ok"], t.loc[1, "slo_ok"]) == (1.0, 0.0)
    assert math.isnan(t.loc[2, "slo_ok"])
    s = summarize(t.reset_index(), simulated_seconds=0.09, wall_seconds=0.0, policy="vllm")
    assert (
        s["slo_attainment"] == 0.5 and s["ttft_attainment"] == 0.5 and s["tpot_attainment"] == 1.0
    )
    assert s["finished"] == s["requests"] == 3
    assert s["throughput_tokens_per_s"] == pytest.approx(9 / 0.09)
    assert s["ttft_p50"] == pytest.approx(0.04)
    # a perfect request scores QoE 1, a delayed one less
    assert t.loc[0, "qoe"] == 1.0 and t.loc[1, "qoe"] < 1.0


def test_rejected_and_aborted_requests_count_as_misses() -> None:
    inst = make_instance("vllm", M=2000)
    big = req(0, 0.0, 2100, 5, slo=SLO(ttft_s=1.0), qoe=QoESpec(1.0, 5.0))
    slow = req(1, 0.0, 10, 1000, slo=SLO(ttft_s=1.0), qoe=QoESpec(0.0, 1000.0))
    for r in (big, slow):
        inst.env.schedule(r.arrival, lambda r=r: inst.add_request(r), 0)
    inst.env.run(until=1.0)
    assert inst.abort_all() == 1
    t = request_table([big, slow], {0: np.asarray(inst.iter_end)}).set_index("req_id")
    assert t.loc[0, "status"] == "rejected" and t.loc[0, "qoe"] == 0.0 and t.loc[0, "slo_ok"] == 0.0
    assert t.loc[1, "status"] == "aborted" and t.loc[1, "slo_ok"] == 0.0
    assert 0.0 < t.loc[1, "qoe"] < 1.0  # scored in flight at the abort time
    s = summarize(t.reset_index(), simulated_seconds=1.0, wall_seconds=0.0, policy="vllm")
    assert (s["rejected"], s["aborted"], s["finished"]) == (1, 1, 0)
    assert s["slo_attainment"] == 0.0 and s["ttft_mean"] is None


def test_attainment_by_class_skips_a_missing_class_as_pandas_groupby() -> None:
    from sloserve.metrics.run_summary import rates_by

    keys = ["rt", None, "be", float("nan"), "rt", None]
    ok = np.array([1.0, 0.0, np.nan, 1.0, 0.0, 1.0])
    t = pd.DataFrame({"class": keys, "slo_ok": ok})
    old = {
        str(c): (float(g["slo_ok"].dropna().mean()) if g["slo_ok"].notna().any() else None)
        for c, g in t.groupby("class", sort=True)
    }
    assert old == {"be": None, "rt": 0.5}
    assert rates_by(keys, ok) == old
    assert rates_by(t["class"].to_numpy(), ok) == old  # summarize() passes an object array
