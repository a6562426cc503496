"""Workloads: trace replay and its errors, named mixes, arrival processes, determinism,
context clipping, SLO / QoE rules and spec validation."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sloserve.core.errors import WorkloadError
from sloserve.core.request import SLO, QoESpec, Request, RequestClass
from sloserve.workloads import (
    BurstyArrivals,
    ClassRule,
    ConstantArrivals,
    FixedLength,
    GammaArrivals,
    PoissonArrivals,
    QoERule,
    UniformLength,
    WorkloadSpec,
    build_requests,
    get_mix,
    mix_names,
)

RT = RequestClass.RT
BE = RequestClass.BE


def write_trace(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def replay(path: Path, **kw: object) -> list[Request]:
    return build_requests(WorkloadSpec(trace=str(path), **kw))  # type: ignore[arg-type]


def lengths(reqs: list[Request]) -> tuple[np.ndarray, np.ndarray]:
    p = np.array([r.num_prompt_tokens for r in reqs], dtype=np.float64)
    o = np.array([r.true_output_len for r in reqs], dtype=np.float64)
    return p, o


def many(mix: str, n: int = 20_000, seed: int = 0) -> list[Request]:
    spec = WorkloadSpec(
        mix=mix,
        arrival=ConstantArrivals(rate=1000.0),
        duration_s=None,
        num_requests=n,
        seed=seed,
    )
    assert spec.max_context is None
    return build_requests(spec, max_context=None)


# ----------------------------------------------------------------------------- trace replay
TRACE = """arrival_s,prompt_tokens,output_tokens
0.0,17,3
0.25,1000,250
0.25,1,1
7.125,4096,2048
"""


def test_trace_replay_keeps_arrivals_and_lengths_exactly(tmp_path: Path) -> None:
    reqs = replay(write_trace(tmp_path, TRACE))
    assert [r.req_id for r in reqs] == [0, 1, 2, 3]
    assert [r.arrival for r in reqs] == [0.0, 0.25, 0.25, 7.125]
    assert [r.num_prompt_tokens for r in reqs] == [17, 1000, 1, 4096]
    assert [r.true_output_len for r in reqs] == [3, 250, 1, 2048]
    # no optional columns: every request is RT with the default RT rule
    assert all(r.req_class is RT for r in reqs)
    assert all(r.priority == 0 for r in reqs)
    assert all(r.model == "default" for r in reqs)
    assert all(r.slo == SLO(0.4, 0.2, None) for r in reqs)


def test_trace_is_not_clipped_or_sampled(tmp_path: Path) -> None:
    """Traces ignore mix and max_context: they are replayed as is (the replay options, an
    explicit duration_s or num_requests are the only ways to cut them)."""
    p = write_trace(tmp_path, TRACE)
    spec = WorkloadSpec(trace=str(p), mix="lmsys", max_context=64, seed=9)
    reqs = build_requests(spec, max_context=128)
    windowed = build_requests(WorkloadSpec(trace=str(p), duration_s=1.0))
    assert [r.arrival for r in windowed] == [0.0, 0.25, 0.25]
    assert len(build_requests(WorkloadSpec(trace=str(p), num_requests=2))) == 2
    assert [(r.num_prompt_tokens, r.true_output_len) for r in reqs] == [
        (17, 3),
        (1000, 250),
        (1, 1),
        (4096, 2048),
    ]
    assert [r.arrival for r in reqs] == [0.0, 0.25, 0.25, 7.125]


def test_trace_tolerates_whitespace_and_column_order(tmp_path: Path) -> None:
    p = write_trace(
        tmp_path,
        " output_tokens , arrival_s ,prompt_tokens\n5, 0.5,10\n 6,1.5 , 11\n",
    )
    reqs = replay(p)
    assert [(r.arrival, r.num_prompt_tokens, r.true_output_len) for r in reqs] == [
        (0.5, 10, 5),
        (1.5, 11, 6),
    ]


def test_trace_optional_columns_applied(tmp_path: Path) -> None:
    p = write_trace(
        tmp_path,
        "arrival_s,prompt_tokens,output_tokens,class,priority,model,ttft_slo_s,tpot_slo_s,"
        "deadline_s\n"
        "0,10,5,rt,2,m1,1.5,0.05,30\n"
        "1,20,6,be,-1,m2,2.5,0.5,60\n"
        "2,30,7,RT,7,m3,,,\n",
    )
    reqs = replay(p)
    assert [r.req_class for r in reqs] == [RT, BE, RT]
    assert [r.priority for r in reqs] == [2, -1, 7]
    assert [r.model for r in reqs] == ["m1", "m2", "m3"]
    assert reqs[0].slo == SLO(1.5, 0.05, 30.0)
    assert reqs[1].slo == SLO(2.5, 0.5, 60.0)
    # empty SLO cells fall back to the RT rule
    assert reqs[2].slo == SLO(0.4, 0.2, None)


def test_trace_empty_optional_cells_fall_back_to_class_rule(tmp_path: Path) -> None:
    p = write_trace(
        tmp_path,
        "arrival_s,prompt_tokens,output_tokens,class,ttft_slo_s,tpot_slo_s,deadline_s\n"
        "0,10,5,be,,,\n"
        "1,10,5,rt,,0.1,\n"
        "2,10,5,,,,\n"
        "3,10,5,be,,,12\n",
    )
    rules = {RT: ClassRule(ttft_s=1.0, tpot_s=0.3, priority=1), BE: ClassRule(deadline_s=99.0)}
    reqs = replay(p, slo=rules)
    assert [r.req_class for r in reqs] == [BE, RT, RT, BE]  # empty class cell -> rt
    assert reqs[0].slo == SLO(None, None, 99.0)
    assert reqs[1].slo == SLO(1.0, 0.1, None)
    assert reqs[2].slo == SLO(1.0, 0.3, None)
    assert reqs[3].slo == SLO(None, None, 12.0)
    # no priority column: the class rule's priority
    assert [r.priority for r in reqs] == [0, 1, 1, 0]
    # default rules when none are given: BE has no SLO at all
    reqs = replay(p)
    assert reqs[0].slo.empty
    assert reqs[2].slo == SLO(0.4, 0.2, None)


def test_trace_empty_priority_cell_falls_back_to_class_rule(tmp_path: Path) -> None:
    p = write_trace(
        tmp_path,
        "arrival_s,prompt_tokens,output_tokens,class,priority\n0,10,5,be,\n1,10,5,rt,3\n",
    )
    reqs = replay(p, slo={BE: ClassRule(priority=5)})
    assert [r.priority for r in reqs] == [5, 3]


def test_trace_qoe_follows_rule(tmp_path: Path) -> None:
    p = write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,100,5\n1,20000,5\n")
    reqs = replay(p)
    assert reqs[0].qoe == QoESpec(1.0, 4.8)
    assert reqs[1].qoe == QoESpec(4.0, 4.8)


def test_trace_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(WorkloadError, match=re.escape(str(missing))):
        replay(missing)


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,abc,5\n", 3, "prompt_tokens"),
        ("arrival_s,prompt_tokens,output_tokens\nzero,10,5\n", 2, "arrival_s"),
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,\n", 3, "output_tokens"),
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n-1,10,5\n", 3, "arrival_s"),
        ("arrival_s,prompt_tokens,output_tokens\n0,0,5\n", 2, "prompt_tokens"),
        ("arrival_s,prompt_tokens,output_tokens\n0,-3,5\n", 2, "prompt_tokens"),
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,2.5\n", 3, "output_tokens"),
        ("arrival_s,prompt_tokens,output_tokens\n0,10,0\n", 2, "output_tokens"),
        ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n2,10,5\n1,10,5\n", 4, "arrival_s"),
        ("arrival_s,prompt_tokens,output_tokens,class\n0,10,5,rt\n1,10,5,gold\n", 3, "class"),
        ("arrival_s,prompt_tokens,output_tokens,priority\n0,10,5,1.5\n", 2, "priority"),
        ("arrival_s,prompt_tokens,output_tokens,priority\n0,10,5,high\n", 2, "priority"),
        ("arrival_s,prompt_tokens,output_tokens,ttft_slo_s\n0,10,5,0\n", 2, "ttft_slo_s"),
        ("arrival_s,prompt_tokens,output_tokens,tpot_slo_s\n0,10,5,-1\n", 2, "tpot_slo_s"),
        ("arrival_s,prompt_tokens,output_tokens,deadline_s\n0,10,5,soon\n", 2, "deadline_s"),
    ],
    ids=[
        "non-numeric-prompt",
        "non-numeric-arrival",
        "empty-required-cell",
        "negative-arrival",
        "zero-prompt",
        "negative-prompt",
        "non-integer-output",
        "zero-output",
        "unsorted",
        "bad-class",
        "non-integer-priority",
        "non-numeric-priority",
        "zero-slo",
        "negative-slo",
        "non-numeric-deadline",
    ],
)
def test_trace_errors_name_file_line_and_column(
    tmp_path: Path, text: str, line: int, column: str
) -> None:
    p = write_trace(tmp_path, text)
    with pytest.raises(WorkloadError) as ei:
        replay(p)
    msg = str(ei.value)
    assert str(p) in msg
    assert f"line {line}" in msg
    assert column in msg
    assert "\n" not in msg


def test_trace_missing_column_names_file_and_column(tmp_path: Path) -> None:
    p = write_trace(tmp_path, "arrival_s,prompt_tokens\n0,10\n")
    with pytest.raises(WorkloadError) as ei:
        replay(p)
    msg = str(ei.value)
    assert str(p) in msg
    assert "output_tokens" in msg
    assert "missing" in msg


@pytest.mark.parametrize(
    "text", ["", "arrival_s,prompt_tokens,output_tokens\n"], ids=["empty", "header-only"]
)
def test_trace_empty_file(tmp_path: Path, text: str) -> None:
    p = write_trace(tmp_path, text)
    with pytest.raises(WorkloadError, match=re.escape(str(p))):
        replay(p)


def test_trace_errors_are_value_errors(tmp_path: Path) -> None:
    p = write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,x,1\n")
    with pytest.raises(ValueError):
        replay(p)


def test_trace_error_line_number_counts_blank_lines(tmp_path: Path) -> None:
    p = write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,10,5\n\n1,10,x\n")
    with pytest.raises(WorkloadError, match=r"line 4\b"):
        replay(p)


def test_trace_extra_field_is_an_error_not_a_column_shift(tmp_path: Path) -> None:
    p = write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,10,5,7\n1,10,5,7\n")
    with pytest.raises(WorkloadError, match=re.escape(str(p))):
        replay(p)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_trace_infinite_tokens_name_the_column(tmp_path: Path) -> None:
    p = write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,inf,5\n")
    with pytest.raises(WorkloadError, match=r"line 2, column prompt_tokens"):
        replay(p)


def test_trace_infinite_arrival_is_an_error(tmp_path: Path) -> None:
    p = write_trace(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,10,5\ninf,10,5\n")
    with pytest.raises(WorkloadError, match=r"line 3, column arrival_s"):
        replay(p)


# ----------------------------------------------------------------------------- named mixes
# BROS Table 2: (prompt mean, prompt std, output mean, output std)
BROS_TABLE_2 = {
    "sharegpt": (222.76, 256.36, 234.51, 268.50),
    "lmsys": (90.50, 148.52, 237.04, 228.21),
}


def test_mix_names() -> None:
    names = mix_names()
    for n in ("be-synthetic", "lmsys", "sharegpt", "andes-sharegpt", "arxiv-summarization", "coding-challenges"):
        assert n in names
    with pytest.raises(KeyError, match="valid: andes-sharegpt, arxiv-summarization, be-synthetic"):
        get_mix("alpaca")
    assert get_mix("fixed-512-128").groups[0][0].sample(np.random.default_rng(0), 3).tolist() == [512] * 3
    with pytest.raises(KeyError):
        get_mix("fixed-0-5")
    with pytest.raises(KeyError):
        get_mix("infermax-sisx")


@pytest.mark.parametrize("mix", sorted(BROS_TABLE_2))
def test_mix_moments_match_bros_table_2(mix: str) -> None:
    reqs = many(mix)
    assert len(reqs) == 20_000
    p, o = lengths(reqs)
    pm, ps, om, os_ = BROS_TABLE_2[mix]
    assert p.mean() == pytest.approx(pm, rel=0.03)
    assert o.mean() == pytest.approx(om, rel=0.03)
    # lognormal tails make the sample std noisier than the mean
    assert p.std() == pytest.approx(ps, rel=0.12)
    assert o.std() == pytest.approx(os_, rel=0.12)
    assert p.min() >= 1 and o.min() >= 1
    assert all(r.req_class is RT for r in reqs)


def test_be_synthetic_lengths_and_class() -> None:
    reqs = many("be-synthetic", n=5000)
    p, o = lengths(reqs)
    assert p.min() >= 512 and p.max() <= 1024
    assert o.min() >= 32 and o.max() <= 128
    # uniform, so both ends are actually reached and the mean is mid-range
    assert p.mean() == pytest.approx(768, rel=0.02)
    assert o.mean() == pytest.approx(80, rel=0.02)
    assert all(r.req_class is BE for r in reqs)
    assert all(r.slo.empty for r in reqs)


def test_length_overrides() -> None:
    spec = WorkloadSpec(
        mix="sharegpt",
        num_requests=200,
        prompt=FixedLength(value=33),
        output=UniformLength(low=2, high=4),
    )
    p, o = lengths(build_requests(spec, max_context=None))
    assert set(p) == {33}
    assert set(o) <= {2, 3, 4}


# ----------------------------------------------------------------------------- arrivals
def _times(proc: object, duration: float | None, count: int | None, seed: int = 0) -> np.ndarray:
    return proc.times(np.random.default_rng(seed), duration, count)  # type: ignore[attr-defined]


LONG = 4000.0


@pytest.mark.parametrize(
    ("proc", "rel"),
    [
        (PoissonArrivals(rate=5.0), 0.03),
        (GammaArrivals(rate=5.0, cv=2.0), 0.06),
        (ConstantArrivals(rate=5.0), 0.001),
        (BurstyArrivals(rate=5.0, intensity=2.0, burst_fraction=0.35, period_s=60.0), 0.03),
    ],
    ids=["poisson", "gamma", "constant", "bursty"],
)
def test_arrival_mean_rate(proc: object, rel: float) -> None:
    t = _times(proc, LONG, None)
    assert t.size / LONG == pytest.approx(5.0, rel=rel)
    assert np.all(np.diff(t) >= 0)
    assert t.min() >= 0 and t.max() < LONG


@pytest.mark.parametrize(
    "proc",
    [
        PoissonArrivals(rate=3.0),
        GammaArrivals(rate=3.0, cv=3.0),
        ConstantArrivals(rate=3.0),
        BurstyArrivals(rate=3.0, intensity=2.5, burst_fraction=0.2, period_s=10.0),
    ],
    ids=["poisson", "gamma", "constant", "bursty"],
)
@pytest.mark.parametrize(("duration", "count"), [(None, 500), (50.0, 20), (1e6, 137)])
def test_arrival_count_cap(proc: object, duration: float | None, count: int) -> None:
    t = _times(proc, duration, count)
    assert t.size == count
    assert np.all(np.diff(t) >= 0)
    assert t[0] >= 0
    if duration is not None:
        assert t[-1] < duration


def test_arrival_duration_bound_when_count_is_larger() -> None:
    t = _times(PoissonArrivals(rate=2.0), 10.0, 10_000)
    assert 0 < t.size < 100
    assert t.max() < 10.0


def test_constant_arrivals_exact() -> None:
    t = _times(ConstantArrivals(rate=4.0), 2.0, None)
    assert t.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]


def test_gamma_gap_cv() -> None:
    for cv in (0.5, 2.0, 3.0):
        t = _times(GammaArrivals(rate=10.0, cv=cv), None, 50_000, seed=1)
        gaps = np.diff(np.concatenate([[0.0], t]))
        assert gaps.mean() == pytest.approx(0.1, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.07)


def test_poisson_gap_cv_is_one() -> None:
    t = _times(PoissonArrivals(rate=10.0), None, 50_000, seed=2)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)


def test_bursty_rate_inside_and_outside_bursts() -> None:
    proc = BurstyArrivals(rate=4.0, intensity=2.5, burst_fraction=0.2, period_s=30.0)
    periods = 300
    t = _times(proc, periods * 30.0, None)
    phase = np.mod(t, 30.0)
    in_burst = phase < 0.2 * 30.0
    burst_rate = in_burst.sum() / (periods * 0.2 * 30.0)
    calm_rate = (~in_burst).sum() / (periods * 0.8 * 30.0)
    assert burst_rate == pytest.approx(2.5 * 4.0, rel=0.04)
    assert calm_rate == pytest.approx(proc.calm_rate, rel=0.05)
    assert proc.calm_rate == pytest.approx(4.0 * (1 - 0.5) / 0.8)
    assert t.size / (periods * 30.0) == pytest.approx(4.0, rel=0.03)


@pytest.mark.parametrize(("intensity", "fraction"), [(2.0, 0.5), (4.0, 0.3), (10.0, 0.1)])
def test_bursty_infeasible_is_validation_error(intensity: float, fraction: float) -> None:
    with pytest.raises(ValidationError, match="intensity"):
        BurstyArrivals(rate=1.0, intensity=intensity, burst_fraction=fraction)
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate(
            {
                "arrival": {
                    "kind": "bursty",
                    "rate": 1.0,
                    "intensity": intensity,
                    "burst_fraction": fraction,
                }
            }
        )


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "poisson", "rate": 0},
        {"kind": "poisson", "rate": -1},
        {"kind": "gamma", "rate": 1, "cv": 0},
        {"kind": "bursty", "rate": 1, "intensity": 1.0},
        {"kind": "bursty", "rate": 1, "burst_fraction": 1.0},
        {"kind": "weibull", "rate": 1},
        {"kind": "poisson", "rate": 1, "cv": 2},
    ],
)
def test_bad_arrival_specs(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate({"arrival": bad})


def test_workload_times_sorted_nonnegative_and_capped() -> None:
    for arrival in (
        PoissonArrivals(rate=8.0),
        GammaArrivals(rate=8.0, cv=4.0),
        ConstantArrivals(rate=8.0),
        BurstyArrivals(rate=8.0, period_s=5.0),
    ):
        reqs = build_requests(WorkloadSpec(arrival=arrival, duration_s=50.0, num_requests=123))
        t = np.array([r.arrival for r in reqs])
        assert len(reqs) == 123
        assert [r.req_id for r in reqs] == list(range(123))
        assert np.all(t >= 0) and np.all(np.diff(t) >= 0) and t.max() < 50.0


# ----------------------------------------------------------------------------- determinism
def _key(reqs: list[Request]) -> list[tuple[object, ...]]:
    return [
        (r.req_id, r.arrival, r.num_prompt_tokens, r.true_output_len, r.req_class, r.slo, r.qoe)
        for r in reqs
    ]


@pytest.mark.parametrize("mix", ["sharegpt", "lmsys", "be-synthetic"])
def test_same_seed_same_requests(mix: str) -> None:
    spec = WorkloadSpec(mix=mix, arrival=GammaArrivals(rate=5.0, cv=2.0), duration_s=60.0, seed=7)
    a = build_requests(spec, max_context=4096)
    b = build_requests(WorkloadSpec.model_validate(spec.model_dump()), max_context=4096)
    assert len(a) > 100
    assert _key(a) == _key(b)


def test_different_seed_different_requests() -> None:
    a = build_requests(WorkloadSpec(duration_s=60.0, seed=0))
    b = build_requests(WorkloadSpec(duration_s=60.0, seed=1))
    ta = [r.arrival for r in a]
    tb = [r.arrival for r in b]
    assert ta != tb
    assert [r.num_prompt_tokens for r in a][:50] != [r.num_prompt_tokens for r in b][:50]


def test_components_draw_independently() -> None:
    """Changing the output distribution or the classes leaves arrivals and prompts alone."""
    base = WorkloadSpec(duration_s=60.0, seed=3)
    other = WorkloadSpec(
        duration_s=60.0, seed=3, output=FixedLength(value=9), classes={RT: 0.5, BE: 0.5}
    )
    a, b = build_requests(base), build_requests(other)
    assert [r.arrival for r in a] == [r.arrival for r in b]
    assert [r.num_prompt_tokens for r in a] == [r.num_prompt_tokens for r in b]
    assert {r.true_output_len for r in b} == {9}


# ----------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("cap", [64, 512, 4096])
def test_clip_to_max_context_argument(cap: int) -> None:
    spec = WorkloadSpec(mix="sharegpt", num_requests=5000, duration_s=None)
    reqs = build_requests(spec, max_context=cap)
    assert all(r.num_prompt_tokens + r.true_output_len <= cap for r in reqs)
    assert all(r.num_prompt_tokens >= 1 and r.true_output_len >= 1 for r in reqs)
    # clipping actually bites at the cap for some long request
    assert max(r.num_prompt_tokens + r.true_output_len for r in reqs) == cap


def test_clip_spec_max_context_wins_over_argument() -> None:
    spec = WorkloadSpec(mix="lmsys", num_requests=5000, duration_s=None, max_context=300)
    reqs = build_requests(spec, max_context=100_000)
    assert all(r.num_prompt_tokens + r.true_output_len <= 300 for r in reqs)
    spec = WorkloadSpec(mix="be-synthetic", num_requests=500, duration_s=None, max_context=600)
    assert all(r.num_prompt_tokens + r.true_output_len <= 600 for r in build_requests(spec))


def test_no_clip_without_max_context() -> None:
    p, o = lengths(many("sharegpt", n=20_000))
    assert (p + o).max() > 4096


# ----------------------------------------------------------------------------- SLO / QoE
def test_default_slo_rules() -> None:
    spec = WorkloadSpec(num_requests=400, duration_s=None, classes={RT: 0.5, BE: 0.5})
    reqs = build_requests(spec)
    rt = [r for r in reqs if r.req_class is RT]
    be = [r for r in reqs if r.req_class is BE]
    assert rt and be
    assert len(rt) / len(reqs) == pytest.approx(0.5, abs=0.1)
    assert all(r.slo == SLO(ttft_s=0.4, tpot_s=0.2, deadline_s=None) for r in rt)
    assert all(r.slo.empty for r in be)
    assert all(r.priority == 0 for r in reqs)


def test_class_fractions() -> None:
    reqs = build_requests(
        WorkloadSpec(num_requests=10_000, duration_s=None, classes={RT: 0.8, BE: 0.2})
    )
    frac_be = sum(r.req_class is BE for r in reqs) / len(reqs)
    assert frac_be == pytest.approx(0.2, abs=0.02)
    only_be = build_requests(
        WorkloadSpec(num_requests=100, duration_s=None, classes={RT: 0.0, BE: 1.0})
    )
    assert all(r.req_class is BE for r in only_be)


@pytest.mark.parametrize("bad", [{"rt": -0.1, "be": 1.0}, {"rt": 0.0, "be": 0.0}, {"gold": 1.0}])
def test_bad_class_fractions(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate({"classes": bad})


def test_slo_overrides() -> None:
    spec = WorkloadSpec.model_validate(
        {
            "num_requests": 400,
            "duration_s": None,
            "classes": {"rt": 0.5, "be": 0.5},
            "slo": {
                "rt": {"ttft_s": 1.0, "tpot_s": 0.1, "priority": 2},
                "be": {"deadline_s": 300.0, "priority": 9},
            },
        }
    )
    reqs = build_requests(spec)
    for r in reqs:
        if r.req_class is RT:
            assert r.slo == SLO(1.0, 0.1, None)
            assert r.priority == 2
        else:
            assert r.slo == SLO(None, None, 300.0)
            assert r.priority == 9


def test_slo_override_of_one_class_keeps_default_for_other() -> None:
    spec = WorkloadSpec(
        num_requests=200, duration_s=None, classes={RT: 1, BE: 1}, slo={BE: ClassRule(ttft_s=5.0)}
    )
    for r in build_requests(spec):
        expected = SLO(5.0, None, None) if r.req_class is BE else SLO(0.4, 0.2, None)
        assert r.slo == expected


def test_default_qoe_rule() -> None:
    spec = WorkloadSpec(num_requests=3000, duration_s=None, mix="sharegpt")
    for r in build_requests(spec, max_context=None):
        assert r.qoe is not None
        assert r.qoe.ttft_s == pytest.approx(max(r.num_prompt_tokens / 5000, 1.0))
        assert r.qoe.tokens_per_s == 4.8
    # a long prompt raises the TTFT target above the 1 s floor
    long = WorkloadSpec(num_requests=2, duration_s=None, prompt=FixedLength(value=12_000))
    assert {r.qoe for r in build_requests(long, max_context=None)} == {QoESpec(2.4, 4.8)}


def test_qoe_overrides() -> None:
    spec = WorkloadSpec(
        num_requests=50,
        duration_s=None,
        prompt=FixedLength(value=1000),
        qoe=QoERule(prefill_tokens_per_s=100.0, min_ttft_s=0.5, tokens_per_s=10.0),
    )
    assert {r.qoe for r in build_requests(spec)} == {QoESpec(10.0, 10.0)}
    fixed = WorkloadSpec.model_validate(
        {"num_requests": 50, "duration_s": None, "qoe": {"ttft_s": 0.25, "tokens_per_s": 3.0}}
    )
    assert {r.qoe for r in build_requests(fixed)} == {QoESpec(0.25, 3.0)}
    small = WorkloadSpec(
        num_requests=5, duration_s=None, prompt=FixedLength(value=10), qoe=QoERule(min_ttft_s=0)
    )
    ttfts = [r.qoe.ttft_s for r in build_requests(small) if r.qoe is not None]
    assert ttfts == [pytest.approx(10 / 5000)] * 5


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "data",
    [
        {"bogus": 1},
        {"arrival": {"kind": "poisson", "rate": 1, "burst": 2}},
        {"slo": {"rt": {"ttft": 0.4}}},
        {"qoe": {"speed": 4.8}},
        {"prompt": {"kind": "fixed", "value": 10, "std": 1}},
    ],
    ids=["top", "arrival", "slo", "qoe", "prompt"],
)
def test_unknown_keys_rejected(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as ei:
        WorkloadSpec.model_validate(data)
    assert any(e["type"] == "extra_forbidden" for e in ei.value.errors())


@pytest.mark.parametrize(
    "data",
    [
        {"mix": "alpaca"},
        {"duration_s": None, "num_requests": None},
        {"duration_s": 0},
        {"num_requests": 0},
        {"max_context": 1},
        {"slo": {"rt": {"ttft_s": 0}}},
        {"prompt": {"kind": "uniform", "low": 10, "high": 5}},
        {"output": {"kind": "fixed", "value": 0}},
    ],
)
def test_invalid_specs(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate(data)


def test_unknown_mix_message_lists_valid_names() -> None:
    with pytest.raises(ValidationError, match="valid: andes-sharegpt, arxiv-summarization, be-synthetic, coding-challenges, lmsys, sharegpt"):
        WorkloadSpec(mix="alpaca")


def test_trace_spec_skips_mix_and_bound_checks(tmp_path: Path) -> None:
    p = write_trace(tmp_path, TRACE)
    spec = WorkloadSpec(trace=str(p), mix="whatever", duration_s=None)
    assert len(build_requests(spec)) == 4


def test_spec_is_frozen() -> None:
    spec = WorkloadSpec()
    with pytest.raises(ValidationError):
        spec.seed = 3  # type: ignore[misc]
    assert math.isclose(spec.arrival.rate, 4.0)
