"""Issue 19, CLI half: every number bounded once, empty workloads, unknown names, one line.

Each class of mistake is tested with several values; the property test walks every numeric
field of the config schema and draws hostile values for it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from cli_helpers import assert_user_error, run_main
from sloserve.core.bounds import MAX_SECONDS, constraint_text
from sloserve.experiments.runner import SimConfig

FAST = ["--duration", "1", "--num-requests", "3", "--cost-model", "constant:0.01"]


# ------------------------------------------------------------------ 1. extreme numbers
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "--rate", "inf"], "--rate"),
        (["simulate", "--rate", "nan"], "--rate"),
        (["simulate", "--rate", "1e300"], "--rate"),
        (["simulate", "--rate", "-3"], "--rate"),
        (["simulate", "--duration", "inf"], "--duration"),
        (["simulate", "--duration", "1e300"], "--duration"),
        (["simulate", "--num-requests", str(10**21)], "--num-requests"),
        (["simulate", "--arrival", "gamma", "--cv", "inf"], "--cv"),
        (["simulate", "--arrival", "gamma", "--cv", "1e-300"], "--cv"),
        (["simulate", "--arrival", "bursty", "--burst-period", "inf"], "--burst-period"),
        (["simulate", "--arrival", "bursty", "--burst-intensity", "1e300"], "--burst-intensity"),
        (["simulate", "--cost-model", "constant:inf"], "constant:inf"),
        (["simulate", "--cost-model", "constant:nan"], "constant:nan"),
        (["simulate", "--cost-model", "constant:-1"], "constant:-1"),
        (["simulate", "--predictor", "constant:1e30"], "--predictor"),
        (["simulate", "--kv-utilization", "nan"], "--kv-utilization"),
        (["simulate", "--horizon", "inf"], "--horizon"),
        (["simulate", "--speedup", "inf"], "--speedup"),
        (["simulate", "--max-batch-tokens", str(2**70)], "--max-batch-tokens"),
        (["simulate", "--rate", "1000000", "--duration", "10000000"], "rate × duration_s"),
        (["simulate", "--seed", "-1"], "--seed"),
        (["simulate", "--seed", str(2**64)], "--seed"),
        (["optimal", "--requests", str(10**21), "--input", "4", "--output", "2"], "--requests"),
        (
            ["optimal", "--requests", "2", "--input", "4", "--output", "2", "--time-limit", "inf"],
            "--time-limit",
        ),
        (["reproduce", "andes", "--seed", "-5"], "--seed"),
    ],
)
def test_extreme_numbers_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    assert_user_error(run_main(monkeypatch, capsys, *args), needle)


def test_help_shows_the_bounds_of_the_fields(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    proc = run_main(monkeypatch, capsys, "simulate", "--help")
    assert proc.returncode == 0
    rate = SimConfig.model_fields["workload"].annotation.model_fields["arrival"]  # type: ignore[union-attr]
    assert rate is not None
    out = " ".join(proc.stdout.split())
    for text in (
        "Mean arrival rate, requests/s (vLLM: --request-rate). [1e-06 ≤ x ≤ 1e+06]",
        "[0 ≤ x ≤ 2**63-1]",
    ):
        assert text in out, text


# ------------------------------------------------------------------ 2. degenerate workloads
def test_empty_workload_reports_zero_requests(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = ["simulate", "--rate", "0.001", "--duration", "5"]
    proc = run_main(monkeypatch, capsys, *base, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["requests"] == 0 and summary["finished"] == 0
    assert summary["ttft_p50"] is None
    proc = run_main(monkeypatch, capsys, *base, "--out", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    assert "0 requests" in proc.stdout
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["vllm"]["requests"] == 0
    proc = run_main(monkeypatch, capsys, "compare", *base[1:], "--policies", "vllm,sarathi")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("0,99999999999999999999999,4", "prompt_tokens"),
        ("0,4,1e30", "output_tokens"),
        ("1e308,4,4", "arrival_s"),
        ("inf,4,4", "arrival_s"),
        ("0,4,4,1e300", "ttft_slo_s"),
    ],
)
def test_trace_values_beyond_the_bounds_name_file_line_column_value(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    row: str,
    column: str,
) -> None:
    header = "arrival_s,prompt_tokens,output_tokens" + (
        ",ttft_slo_s" if row.count(",") == 3 else ""
    )
    trace = tmp_path / "t.csv"
    trace.write_text(f"{header}\n{row}\n")
    with _no_warning():
        proc = run_main(monkeypatch, capsys, "simulate", "--trace", str(trace))
    value = row.split(",")[header.split(",").index(column)]
    assert_user_error(proc, str(trace), "line 2", f"column {column}", value)


class _no_warning:
    """numpy must not warn on the way to the error (the issue's int64 overflow warning)."""

    def __enter__(self) -> None:
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


# ------------------------------------------------------------------ 3. unknown names
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            [
                "optimal",
                "--warm-start",
                "nosuch",
                "--requests",
                "2",
                "--input",
                "4",
                "--output",
                "2",
            ],
            "valid: ",
        ),
        (
            [
                "optimal",
                "--better-than",
                "nosuch",
                "--requests",
                "2",
                "--input",
                "4",
                "--output",
                "2",
            ],
            "valid: ",
        ),
        (
            [
                "optimal",
                "--objective",
                "nosuch",
                "--requests",
                "2",
                "--input",
                "4",
                "--output",
                "2",
            ],
            "valid: ",
        ),
        (["simulate", "--policy", "nosuch"], "valid: "),
        (["simulate", "--router", "nosuch", "--replicas", "2"], "nosuch"),
        (["simulate", "--predictor", "nosuch"], "valid: "),
        (["simulate", "--cost-model", "nosuch"], "valid: "),
        (["simulate", "--workload", "nosuch"], "nosuch"),
        (["simulate", "--trace-format", "nosuch"], "nosuch"),
        (["simulate", "--arrival", "nosuch"], "nosuch"),
        (["simulate", "--slo", "nosuch"], "nosuch"),
        (["simulate", "--profile", "nosuch"], "nosuch"),
        (["compare", "--policies", "vllm,nosuch"], "valid: "),
    ],
)
def test_unknown_names_are_refused_with_the_valid_ones(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    assert_user_error(run_main(monkeypatch, capsys, *args), needle)


# ------------------------------------------------------------------ 4. one line always
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "--seed", "abc"], "--seed"),
        (["simulate", "--rate", "fast"], "--rate"),
        (["reproduce", "nosuch"], "andes"),
        (["nosuch"], "simulate"),
        (["reproduce", "andes", "--workers", "0"], "--workers"),
        (["reproduce", "bros", "--workers", "-1"], "--workers"),
        (["simulate", "--no-such-option"], "--no-such-option"),
        (["costmodel", "fit"], "csv"),
        (["simulate", "--rate"], "--rate"),
    ],
)
def test_usage_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    assert_user_error(run_main(monkeypatch, capsys, *args), needle)


@pytest.mark.parametrize("args", [["--help"], ["simulate", "--help"], ["reproduce", "--help"]])
def test_help_still_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    proc = run_main(monkeypatch, capsys, *args)
    assert proc.returncode == 0 and "Usage" in proc.stdout and proc.stderr == ""


# ------------------------------------------------------------------ property test
Leaf = tuple[tuple[str, ...], dict[tuple[str, ...], str], FieldInfo]


def _walk(model: type[BaseModel], path: tuple[str, ...] = (), tags: Any = None) -> list[Leaf]:
    """Every numeric leaf below ``model``: its path, the ``kind`` of each union member on
    the way (discriminated unions), and its FieldInfo."""
    tags = dict(tags or {})
    out: list[Leaf] = []
    for name, info in model.model_fields.items():
        numeric = False
        for tp in _flatten(info.annotation):
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                kind = tp.model_fields.get("kind")
                sub = {**tags, **({(*path, name): kind.default} if kind is not None else {})}
                out += _walk(tp, (*path, name), sub)
            elif tp in (int, float) and not numeric:
                numeric = True
                out.append(((*path, name), tags, info))
    return out


def _flatten(tp: Any) -> list[Any]:
    if getattr(tp, "__origin__", None) in (list, dict):
        return []
    args = get_args(tp)
    if not args:
        return [tp]
    return [x for a in args for x in _flatten(a)]


def _leaves() -> list[Leaf]:
    return _walk(SimConfig)


LEAVES = _leaves()
HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0, 0.0, -1, -1e300, 1e300, 10**21, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.sampled_from(["abc", "", None, True, [1], {"a": 1}]),
)


def test_the_walk_finds_the_numeric_fields() -> None:
    names = {".".join(p) for p, _, _ in LEAVES}
    for must in (
        "workload.arrival.rate",
        "workload.arrival.cv",
        "workload.arrival.period_s",
        "workload.duration_s",
        "workload.num_requests",
        "workload.seed",
        "workload.replay.speedup",
        "workload.qoe.tokens_per_s",
        "instance.kv_utilization",
        "horizon_s",
    ):
        assert must in names, must
    unbounded = [
        ".".join(p)
        for p, _, info in LEAVES
        if "x ≤" not in constraint_text(info) and "x <" not in constraint_text(info)
    ]
    assert unbounded == [], unbounded


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(leaf=st.sampled_from(LEAVES), value=HOSTILE)
def test_any_value_of_any_numeric_field_is_a_run_or_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path_factory: pytest.TempPathFactory,
    leaf: Leaf,
    value: Any,
) -> None:
    path, tags, _ = leaf
    cfg: dict[str, Any] = {
        "workload": {
            "duration_s": 1.0,
            "num_requests": 3,
            "arrival": {"kind": "poisson", "rate": 4},
        },
        "instance": {"cost_model": "constant:0.01"},
    }
    node = cfg
    for i in range(len(path) - 1):
        nxt = node.get(path[i])
        if not isinstance(nxt, dict):
            nxt = {}
        node[path[i]] = nxt
        node = nxt
        kind = tags.get(path[: i + 1])
        if kind is not None and node.get("kind") != kind:
            node.clear()
            node["kind"] = kind
            if path[i] == "arrival":
                node["rate"] = 4
            if path[i] in ("prompt", "output"):
                node.update(
                    {
                        "fixed": {"value": 8},
                        "uniform": {"low": 1, "high": 8},
                        "lognormal": {"mean": 8, "std": 2},
                    }[kind]
                )
            if kind == "choice":
                node["values"] = [4.0]
            if kind == "normal":
                node.update({"mean": 4.0, "std": 1.0})
    node[path[-1]] = value
    f = tmp_path_factory.mktemp("prop") / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    proc = run_main(monkeypatch, capsys, "simulate", "--config", str(f), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 0:
        summary = json.loads(proc.stdout)
        assert summary["simulated_seconds"] <= 2 * MAX_SECONDS
    else:
        assert_user_error(proc)


# Options of `serve` bounded by the gateway's own settings models (GatewaySettings,
# EmulatedConfig, UpstreamConfig), which the command validates before it starts.
_SERVE_SETTINGS = {
    "replicas", "time_scale", "max_queue", "max_concurrency", "retries", "breaker_failures",
    "breaker_open_s", "health_interval_s", "health_timeouts", "connect_timeout_s", "read_timeout_s",
    "queue_timeout_s", "default_max_tokens", "drain_timeout", "request_read_timeout_s",
    "max_body_bytes", "workers", "seed", "port",
}


def _numeric_options() -> list[tuple[str, str, bool]]:
    import typer

    from sloserve.cli import app
    from sloserve.cli._options import _FLAG_PATHS

    out: list[tuple[str, str, bool]] = []

    def walk(c: object, path: list[str]) -> None:
        for name, sub in getattr(c, "commands", {}).items():
            walk(sub, [*path, name])
        for p in getattr(c, "params", []):
            td = getattr(p, "type_descriptor", None)
            if td is not None and td.annotation in (int, float):
                covered = p.callback is not None or p.name in _FLAG_PATHS
                if path == ["serve"] and p.name in _SERVE_SETTINGS:
                    covered = True
                out.append((" ".join(path), p.opts[0], covered))

    walk(typer.main.get_command(app), [])
    return out


def test_every_numeric_option_of_every_command_is_bounded() -> None:
    opts = _numeric_options()
    assert len(opts) > 100  # the walk sees the whole app
    unbounded = [(cmd, opt) for cmd, opt, covered in opts if not covered]
    assert not unbounded, unbounded


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--replicas", "1e9"],
        ["simulate", "--replicas", "100000"],
        ["sweep", "--config", "x.yaml", "--workers", "99999"],
        ["costmodel", "show", "llama-2-7b-a100", "--tp", "0"],
        ["costmodel", "show", "llama-2-7b-a100", "--utilization", "inf"],
        ["costmodel", "show", "llama-2-7b-a100", "--tpot-ms", "nan"],
        ["workload", "describe", "--bin", "-1"],
        ["reproduce", "bros", "--be-batch-seconds", "1e300"],
        ["reproduce", "infermax", "--csp-time-limit", "inf"],
        ["optimal", "--deterministic-limit", "-5"],
    ],
)
def test_command_only_options_refuse_out_of_bound_values(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = run_main(monkeypatch, capsys, *args)
    assert_user_error(proc, args[-2])


def _cluster_leaves() -> list[tuple[tuple[Any, ...], Leaf]]:
    """Numeric leaves of a cluster section, including those inside its lists (a replica
    group, a failure, a drain): (where the leaf's model sits in the config, leaf)."""
    from sloserve.cluster.config import ClusterConfig, Drain, Failure, ReplicaGroup

    out: list[tuple[tuple[Any, ...], Leaf]] = [(("cluster",), lf) for lf in _walk(ClusterConfig)]
    out += [(("cluster", "replicas", 0), lf) for lf in _walk(ReplicaGroup)]
    out += [(("cluster", "failures", 0), lf) for lf in _walk(Failure)]
    out += [(("cluster", "drains", 0), lf) for lf in _walk(Drain)]
    return out


CLUSTER_LEAVES = _cluster_leaves()


def test_cluster_leaves_are_found_and_bounded() -> None:
    names = {".".join(map(str, (*where, *lf[0]))) for where, lf in CLUSTER_LEAVES}
    for must in ("cluster.replicas.0.count", "cluster.failures.0.at_s", "cluster.drains.0.at_s"):
        assert must in names, must
    unbounded = [
        ".".join(map(str, (*where, *lf[0])))
        for where, lf in CLUSTER_LEAVES
        if "x ≤" not in constraint_text(lf[2]) and "x <" not in constraint_text(lf[2])
    ]
    assert unbounded == [], unbounded


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(leaf=st.sampled_from(CLUSTER_LEAVES), value=HOSTILE)
def test_any_value_of_any_numeric_cluster_field_is_a_run_or_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path_factory: pytest.TempPathFactory,
    leaf: tuple[tuple[Any, ...], Leaf],
    value: Any,
) -> None:
    where, (path, tags, _) = leaf
    cfg: dict[str, Any] = {
        "workload": {"duration_s": 1.0, "num_requests": 3},
        "instance": {"cost_model": "constant:0.01"},
        "cluster": {
            "replicas": [{"count": 2}],
            "failures": [{"replica": 0, "at_s": 0.5}],
            "drains": [{"replica": 1, "at_s": 0.7}],
        },
    }
    node: Any = cfg
    for key in where:
        node = node[key]
    for i in range(len(path) - 1):
        nxt = node.get(path[i])
        if not isinstance(nxt, dict):
            nxt = {}
        node[path[i]] = nxt
        node = nxt
        kind = tags.get(path[: i + 1])
        if kind is not None and node.get("kind") != kind:
            node.clear()
            node["kind"] = kind
    node[path[-1]] = value
    f = tmp_path_factory.mktemp("prop") / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    proc = run_main(monkeypatch, capsys, "simulate", "--config", str(f), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode != 0:
        assert_user_error(proc)
