"""The Vidur agreement harness (``benchmarks/vidur_agreement.py``) without Vidur installed:
its comparison code on a tiny workload and a stub Vidur result in Vidur's own format, and
the ``vidur-lor`` router's semantics."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sloserve.cluster.routing import make_router
from sloserve.cluster.view import ClusterView, ReplicaStatus, RouteRequest, StaticReplica

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "vidur_agreement.py"


@pytest.fixture(scope="module")
def va() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vidur_agreement", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vidur_agreement"] = mod
    spec.loader.exec_module(mod)
    return mod


# Vidur's request_metrics.csv header (0.0.26, MetricsStore._store_request_metrics: "Request
# Id" then every request time distribution and histogram, joined on the id).
VIDUR_HEADER = (
    "Request Id,request_e2e_time,request_e2e_time_normalized,request_execution_time,"
    "request_execution_time_normalized,request_model_execution_time,"
    "request_model_execution_time_normalized,request_preemption_time,"
    "request_scheduling_delay,request_execution_plus_preemption_time,"
    "request_execution_plus_preemption_time_normalized,prefill_e2e_time,"
    "prefill_time_execution_plus_preemption,"
    "prefill_time_execution_plus_preemption_normalized,"
    "decode_time_execution_plus_preemption_normalized,request_inter_arrival_delay,"
    "request_num_tokens,request_num_prefill_tokens,request_num_decode_tokens,"
    "request_pd_ratio,request_num_restarts"
)

REQUESTS = [(0.0, 300, 20), (0.05, 120, 8), (0.1, 700, 30), (0.4, 64, 12), (0.45, 250, 5)]


def _write_requests(d: Path) -> None:
    lines = ["Date,Time,PromptTokenCount,CompletionTokenCount"]
    lines += [f"2023-08-21,{t!r},{p},{n}" for t, p, n in REQUESTS]
    (d / "requests.csv").write_text("\n".join(lines) + "\n")


def _write_vidur_stub(d: Path, ttft: list[float], e2e: list[float], restarts: list[int]) -> None:
    rows = [VIDUR_HEADER]
    ncol = len(VIDUR_HEADER.split(","))
    for i, ((_, p, n), a, b, r) in enumerate(zip(REQUESTS, ttft, e2e, restarts, strict=True)):
        vals = [""] * ncol
        names = VIDUR_HEADER.split(",")
        vals[0] = str(i)
        put = {
            "request_e2e_time": b,
            "prefill_e2e_time": a,
            "decode_time_execution_plus_preemption_normalized": (b - a) / n,
            "request_num_prefill_tokens": p,
            "request_num_decode_tokens": n,
            "request_num_restarts": r,
        }
        for k, v in put.items():
            vals[names.index(k)] = repr(float(v)) if k != "request_num_restarts" else str(v)
        rows.append(",".join(vals))
    (d / "request_metrics.csv").write_text("\n".join(rows) + "\n")


def test_percentiles_match_numpy(va: ModuleType) -> None:
    import numpy as np

    xs = [0.3, 0.1, 0.7, 0.2, float("nan"), 0.9]
    clean = [x for x in xs if x == x]
    for q in (0.5, 0.9):
        assert va._pct(xs, q) == pytest.approx(float(np.quantile(clean, q)))
    assert va._mean(xs) == pytest.approx(sum(clean) / len(clean))


def test_compare_on_a_tiny_workload_against_a_stub_vidur_result(
    va: ModuleType, tmp_path: Path
) -> None:
    _write_requests(tmp_path)
    s = va.Setting("vllm", 10.0, len(REQUESTS))
    summary = va.run_sloserve(s, tmp_path, va.PROFILE, kv_capacity_tokens=20_000)
    assert summary["finished"] == len(REQUESTS)
    ours = va.read_sloserve(tmp_path)
    # The stub: Vidur saw every request 10% slower to its first token and 20% slower overall.
    import csv

    with open(tmp_path / "sloserve_requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    ttft = [1.1 * float(r["ttft_s"]) for r in rows]
    e2e = [1.2 * float(r["e2e_s"]) for r in rows]
    _write_vidur_stub(tmp_path, ttft, e2e, [0, 1, 0, 0, 2])
    cmp = va.compare_dir(tmp_path)
    m = cmp["metrics"]
    assert m["ttft_p50"]["diff"] == pytest.approx(1 / 1.1 - 1)
    assert m["e2e_p90"]["diff"] == pytest.approx(1 / 1.2 - 1)
    assert m["ttft_p50"]["sloserve"] == pytest.approx(ours.metrics["ttft_p50"])
    # TPOT is scored by Vidur's definition on both sides: (e2e − ttft) / decode tokens.
    ours_tpot = [
        (float(r["e2e_s"]) - float(r["ttft_s"])) / n
        for r, (_, _, n) in zip(rows, REQUESTS, strict=True)
    ]
    assert m["tpot_mean"]["sloserve"] == pytest.approx(sum(ours_tpot) / len(ours_tpot))
    assert cmp["restarts"] == {"vidur": 3, "sloserve": 0}
    table = va.format_table(cmp)
    assert "| ttft_p50 |" in table and "-9.1%" in table
    # --from-results reads the same directory back and prints the same table.
    assert va.compare_results(tmp_path)[0]["metrics"] == m


def test_compare_refuses_runs_of_different_requests(va: ModuleType, tmp_path: Path) -> None:
    _write_requests(tmp_path)
    va.run_sloserve(va.Setting("vllm", 10.0, 5), tmp_path, va.PROFILE, kv_capacity_tokens=20_000)
    _write_vidur_stub(tmp_path, [0.1] * 5, [1.0] * 5, [0] * 5)
    lines = (tmp_path / "request_metrics.csv").read_text().splitlines()
    (tmp_path / "request_metrics.csv").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(SystemExit, match="not the same run"):
        va.compare_dir(tmp_path)


def test_batch_report_prices_vidur_batches(va: ModuleType, tmp_path: Path) -> None:
    header = (
        "replica,num_decode,decode_kv_sum,prefill_chunks,total_time_s,"
        "tp_comm_ms_per_allreduce,attn_decode_ms_per_layer,attn_prefill_ms_per_layer"
    )
    (tmp_path / "batches.csv").write_text(
        header + "\n1,0,0,512:512|100:100,0.25,0.09,0.0,0.2\n1,32,32768,,0.06,0.08,0.05,0.0\n"
    )
    rep = va.batch_report(tmp_path, va.PROFILE)
    assert "| decode 25-48 | 1 | 60.00 |" in rep
    assert "| prefill only | 1 | 250.00 |" in rep
    # Vidur's all-reduce per iteration: 2 per layer × 80 layers × 0.08 ms = 12.8 ms.
    assert "| 12.80 |" in rep


def _view(waiting: list[int], running: list[int]) -> ClusterView:
    reps = [
        StaticReplica(
            replica_id=i,
            model="m",
            status=ReplicaStatus.UP,
            running=r,
            waiting=w,
            swapped=0,
            outstanding=w + r,
        )
        for i, (w, r) in enumerate(zip(waiting, running, strict=True))
    ]
    return ClusterView(reps)


def test_vidur_lor_counts_only_waiting_and_ties_to_replica_0() -> None:
    router = make_router("vidur-lor")
    rr = RouteRequest(req_id=1, model="m", prompt_tokens=10)
    # Replica 0 runs 100 requests but has none waiting: Vidur's LOR still picks it.
    assert router.route(rr, _view([0, 0, 0, 0], [100, 0, 0, 0])) == 0
    assert router.route(rr, _view([2, 1, 1, 3], [0, 0, 0, 0])) == 1
    # least-outstanding counts everything held, and rotates among ties.
    lo = make_router("least-outstanding")
    assert lo.route(rr, _view([0, 0, 0, 0], [100, 0, 0, 0])) != 0


def test_vidur_meta_round_trip_names_kv_capacity(va: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "vidur_meta.json").write_text(json.dumps({"num_blocks": 3, "block_size": 16}))
    meta = json.loads((tmp_path / "vidur_meta.json").read_text())
    assert int(meta["num_blocks"]) * int(meta["block_size"]) == 48
