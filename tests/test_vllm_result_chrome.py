"""--result-format vllm and --chrome-trace: checked against vLLM's field names/units and the
Trace Event Format's required fields as written down here from their sources, and against
values computed by hand on a tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import cli_argv, run_many
from sloserve.cluster import ClusterConfig
from sloserve.core.request import Request
from sloserve.experiments.chrome_trace import chrome_trace, per_run_paths
from sloserve.experiments.cluster_run import simulate_cluster
from sloserve.experiments.runner import InstanceConfig, SimConfig, compare, simulate
from sloserve.experiments.vllm_result import vllm_result, vllm_results_text
from sloserve.workloads import PoissonArrivals, UniformLength, WorkloadSpec

# ``vllm bench serve --save-result`` keys (vllm/benchmarks/serve.py: result_json setup keys,
# benchmark()'s result dict, process_one_metric for the default --percentile-metrics
# "ttft,tpot,itl" and --metric-percentiles "99"); latencies in ms, duration in s,
# throughputs per second.
VLLM_SETUP_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency",
}  # fmt: skip
VLLM_RESULT_KEYS = {
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
}  # fmt: skip
VLLM_METRIC_KEYS = {
    f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl") for s in ("mean", "median", "std", "p99")
}

CONST = InstanceConfig(cost_model="constant:0.01")  # every iteration takes 10 ms


def tiny() -> tuple[SimConfig, list[Request]]:
    """Two requests that never overlap and one the model cannot hold (context 4096)."""
    reqs = [
        Request(0, 0.0, 4, 3),  # tokens at 0.01, 0.02, 0.03
        Request(1, 1.0, 2, 2),  # tokens at 1.01, 1.02
        Request(2, 2.0, 5000, 1),  # rejected at 2.0
    ]
    cfg = SimConfig(workload=WorkloadSpec(arrival=PoissonArrivals(rate=1.5)), instance=CONST)
    return cfg, reqs


def test_vllm_keys_units_and_values_by_hand() -> None:
    cfg, reqs = tiny()
    r = simulate(cfg, reqs)
    d = vllm_result(r, metrics=("ttft", "tpot", "itl", "e2el"), date="20250101-000000")
    assert set(d) >= VLLM_SETUP_KEYS | VLLM_RESULT_KEYS | VLLM_METRIC_KEYS
    assert d["num_prompts"] == 3 and d["completed"] == 2 and d["failed"] == 1
    assert d["total_input_tokens"] == 6 and d["total_output_tokens"] == 5
    assert d["duration"] == pytest.approx(2.0)  # the run ends with the rejection at 2 s
    assert d["request_throughput"] == pytest.approx(2 / 2.0)
    assert d["output_throughput"] == pytest.approx(5 / 2.0)
    assert d["total_token_throughput"] == pytest.approx(11 / 2.0)
    ms = pytest.approx
    assert d["mean_ttft_ms"] == ms(10.0) and d["median_ttft_ms"] == ms(10.0)
    assert d["std_ttft_ms"] == ms(0.0, abs=1e-9)
    # TPOT excludes the first token: (30 - 10) / 2 and (20 - 10) / 1
    assert d["mean_tpot_ms"] == ms(10.0) and d["p99_tpot_ms"] == ms(10.0)
    # ITL: every gap, pooled: [10, 10] and [10]
    assert d["mean_itl_ms"] == ms(10.0) and d["std_itl_ms"] == ms(0.0, abs=1e-9)
    # E2EL 30 and 20 ms: mean 25, population std 5, p99 = 20 + 0.99 * 10
    assert d["mean_e2el_ms"] == ms(25.0) and d["std_e2el_ms"] == ms(5.0)
    assert d["p99_e2el_ms"] == ms(29.9)
    assert d["max_concurrent_requests"] == 1
    assert d["max_output_tokens_per_s"] == 3.0  # 3 tokens in [0, 1) s, 2 in [1, 2)
    assert d["request_rate"] == 1.5 and d["burstiness"] == 1.0
    assert d["date"] == "20250101-000000" and d["backend"] == "sloserve-sim"
    # default metrics: no e2el keys (as vLLM), other percentiles on request
    d2 = vllm_result(r, percentiles=(50, 90.5))
    assert "mean_e2el_ms" not in d2 and "p99_ttft_ms" not in d2
    assert d2["p50_ttft_ms"] == ms(10.0) and "p90.5_itl_ms" in d2
    json.dumps(d2, allow_nan=False)  # strict JSON


def test_vllm_results_cli_simulate_and_compare(tmp_path: Path) -> None:
    fast = ("--cost-model", "constant:0.01", "--rate", "5", "--duration", "4", "--seed", "2")
    out = run_many(
        {
            "sim": cli_argv("simulate", *fast, "--result-format", "vllm", "--out", tmp_path / "r"),
            "cmp": cli_argv(
                "compare", *fast, "--policies", "vllm,sarathi", "--result-format", "vllm"
            ),
            "bad": cli_argv("simulate", *fast, "--result-format", "csv"),
        }
    )
    assert out["sim"].returncode == 0, out["sim"].stderr
    d = json.loads(out["sim"].stdout)
    assert set(d) >= VLLM_SETUP_KEYS | VLLM_RESULT_KEYS | VLLM_METRIC_KEYS
    assert (
        json.loads((tmp_path / "r" / "vllm_result.json").read_text())["completed"] == d["completed"]
    )
    rows = [json.loads(x) for x in out["cmp"].stdout.splitlines()]
    assert [x["label"] for x in rows] == ["vllm", "sarathi"]
    assert out["bad"].returncode == 2 and "vllm" in out["bad"].stderr


# ---------------------------------------------------------------- Chrome / Perfetto traces
# Trace Event Format (Google's "Trace Event Format" document): every event has "ph"; the
# phases used here and their required fields.
REQUIRED = {
    "X": {"name", "ph", "ts", "dur", "pid", "tid"},  # complete event: ts, dur in µs
    "B": {"name", "ph", "ts", "pid", "tid"},
    "E": {"ph", "ts", "pid", "tid"},
    "i": {"name", "ph", "ts", "pid", "tid", "s"},  # instant; s: g|p|t scope
    "C": {"name", "ph", "ts", "pid", "args"},  # counter: args hold the series
    "M": {"name", "ph", "pid", "args"},  # metadata: process_name/thread_name/... + args.name
}
METADATA_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace_format(doc: dict[str, object]) -> list[dict[str, object]]:
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    for ev in events:
        assert isinstance(ev, dict)
        ph = ev["ph"]
        assert ph in REQUIRED, ph
        missing = REQUIRED[ph] - set(ev)
        assert not missing, (missing, ev)
        if ph == "M":
            assert ev["name"] in METADATA_NAMES
        if "ts" in ev:
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        if ph == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
        if ph == "i":
            assert ev["s"] in ("g", "p", "t")
        assert isinstance(ev["pid"], int)
    json.dumps(doc, allow_nan=False)
    return events  # type: ignore[return-value]


def test_chrome_trace_tiny_run_by_hand() -> None:
    cfg, reqs = tiny()
    r = simulate(cfg, reqs)
    ev = check_trace_format(chrome_trace(r))
    slices = [(e["tid"], e["name"]) for e in ev if e["ph"] == "X" and e["tid"] != 0]
    # each served request: queued (0 long: admitted at once), prefill, decode
    assert sorted(slices) == sorted(
        [(1, "queued"), (1, "prefill"), (1, "decode"), (2, "queued"), (2, "prefill"),
         (2, "decode"), (3, "queued")]
    )  # fmt: skip
    by = {(e["tid"], e["name"]): e for e in ev if e["ph"] in "Xi"}
    assert by[(1, "prefill")]["ts"] == 0 and by[(1, "prefill")]["dur"] == pytest.approx(1e4)
    assert by[(1, "decode")]["ts"] == pytest.approx(1e4)
    assert by[(1, "decode")]["dur"] == pytest.approx(2e4)
    assert by[(1, "decode")]["args"]["tokens"] == 3
    assert by[(2, "prefill")]["ts"] == pytest.approx(1e6)
    assert by[(3, "rejected")]["ts"] == pytest.approx(2e6)
    assert "context" in by[(3, "rejected")]["args"]["reason"]
    batches = [e for e in ev if e["ph"] == "X" and e["tid"] == 0]
    assert len(batches) == len(r.trace)
    assert sum(e["args"]["iterations"] for e in batches) == 5  # 3 + 2 tokens, 1 each
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"batches", "req 0", "req 1", "req 2"}
    assert [e["args"]["name"] for e in ev if e["name"] == "process_name"] == ["replica 0"]


def test_chrome_trace_preemption_and_failover() -> None:
    wl = WorkloadSpec(
        arrival=PoissonArrivals(rate=40),
        duration_s=2.0,
        seed=11,
        prompt=UniformLength(low=16, high=400),
        output=UniformLength(low=4, high=120),
    )
    cfg = SimConfig(workload=wl, instance=InstanceConfig(max_running=16, kv_capacity_tokens=3000))
    r = simulate(cfg)
    assert r.summary["preemptions"] > 0
    ev = check_trace_format(chrome_trace(r))
    names = [e["name"] for e in ev if e["ph"] == "X"]
    assert names.count("preempted") == r.summary["preemptions"]
    assert names.count("recompute") >= 1
    for p in ("swap",):
        rs = simulate(cfg.model_copy(update={"policy_params": {"preemption_mode": p}}))
        evs = check_trace_format(chrome_trace(rs))
        assert sum(e["name"] == "swapped" for e in evs) == rs.summary["swaps"] > 0
    cc = ClusterConfig(replicas=[{"count": 2}], failures=[{"replica": 0, "at_s": 1.0}])
    rc = simulate_cluster(cfg, cc)
    evc = check_trace_format(chrome_trace(rc))
    assert sum(e["name"] == "failed over" for e in evc) == rc.summary["failovers"] > 0
    procs = [e["args"]["name"] for e in evc if e["name"] == "process_name"]
    assert procs == ["replica 0", "replica 1"]
    # a request that failed over has slices on both replicas, on its own thread
    moved = {e["tid"] for e in evc if e["name"] == "failed over"}
    tid = sorted(moved)[0]
    assert {e["pid"] for e in evc if e.get("tid") == tid and e["ph"] == "X"} == {1, 2}
    assert chrome_trace(rc) == chrome_trace(simulate_cluster(cfg, cc))  # deterministic


def test_chrome_trace_cli_one_file_per_run(tmp_path: Path) -> None:
    fast = ("--cost-model", "constant:0.01", "--rate", "5", "--duration", "3")
    out = run_many(
        {
            "cmp": cli_argv(
                "compare",
                *fast,
                "--policies",
                "vllm,sarathi",
                "--chrome-trace",
                tmp_path / "t.json",
            ),
            "sim": cli_argv("simulate", *fast, "--chrome-trace", tmp_path / "one.json", "--json"),
        }
    )
    assert out["cmp"].returncode == 0, out["cmp"].stderr
    assert out["sim"].returncode == 0, out["sim"].stderr
    for f in ("t.vllm.json", "t.sarathi.json", "one.json"):
        check_trace_format(json.loads((tmp_path / f).read_text()))
    assert per_run_paths("a/t.json", ["vllm / rr", "x"]) == [
        Path("a/t.vllm_rr.json"),
        Path("a/t.x.json"),
    ]


def test_vllm_text_for_several_runs_is_one_line_each() -> None:
    cfg, _reqs = tiny()
    res = compare(
        cfg.model_copy(update={"workload": WorkloadSpec(duration_s=2, seed=1)}), ["vllm", "sarathi"]
    )
    lines = vllm_results_text(res).splitlines()
    assert [json.loads(x)["label"] for x in lines] == ["vllm", "sarathi"]
    assert np.isfinite(json.loads(lines[0])["mean_ttft_ms"])
