"""Calibrated profiles for every Vidur model/GPU pair, and the roofline against Vidur's data.

Run with ``-s`` (or ``-rP``) to see the roofline-vs-Vidur error table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sloserve.costmodel import load_profile
from sloserve.costmodel.calibrate import (
    GROUPS,
    ValidationRow,
    calibrate_all,
    calibrate_attention,
    format_table,
    group_summary,
    validate_roofline,
    vidur_pairs,
)
from sloserve.costmodel.catalog import gpu_spec
from sloserve.costmodel.profile import ReplicaProfile, profile_names
from sloserve.costmodel.roofline import DEFAULT_PARAMS

REPO = Path(__file__).resolve().parents[1]
VIDUR_DIR = REPO.parent / "shared" / "vidur-profiling"
sys.path.insert(0, str(REPO / "scripts"))
from fit_vidur_profiles import render  # noqa: E402

EXPECTED = {
    "codellama-34b-a100": 1,
    "codellama-34b-a40x2": 2,
    "codellama-34b-h100": 1,
    "internlm-20b-a100": 1,
    "internlm-20b-a40x2": 2,
    "internlm-20b-h100": 1,
    "llama-2-70b-a100x2": 2,
    "llama-2-70b-a40x4": 4,
    "llama-2-70b-h100x2": 2,
    "llama-2-7b-a100": 1,
    "llama-2-7b-a40": 1,
    "llama-2-7b-h100": 1,
    "llama-3-70b-a100x2": 2,
    "llama-3-8b-a100": 1,
    "phi-2-a100": 1,
    "phi-2-a40": 1,
    "phi-2-h100": 1,
    "qwen-72b-a100x4": 4,
    "qwen-72b-a40x8": 8,
    "qwen-72b-h100x4": 4,
}
"""Profile name → TP chosen by the rule (smallest TP with M(0.9) ≥ max(context, 16k))."""

ABOVE_10_PERCENT = {("llama-2-70b-a100x2", "all_reduce"): 0.11}
"""Known exceptions to the 10% held-out bound, with their own bound. The all-reduce line is
fitted for the iteration time, not the message (vidur_tables: issue 22): on the 2-GPU
pairwise-NVLink curve, flat at ~0.06 ms up to ~500 tokens and then linear, that trades
per-message error at the 4k-token sizes (now ~12% low) for the decode sizes (median error
22% → 10%); per message the held-out median is 10.1%. (The 4-GPU a100_dgx exception this
replaced, 10.4%, is 9.5% with the same objective.)"""

R2_BELOW_095 = {("llama-2-70b-a100x2", "all_reduce"): 0.94}
"""The same trade, in R² per message (0.946)."""

needs_vidur = pytest.mark.skipif(
    not VIDUR_DIR.is_dir(), reason=f"Vidur profiling data not found at {VIDUR_DIR}"
)


@pytest.fixture(scope="module")
def calibrated() -> dict[str, ReplicaProfile]:
    if not VIDUR_DIR.is_dir():
        pytest.skip(f"Vidur profiling data not found at {VIDUR_DIR}")
    return calibrate_all(VIDUR_DIR)


@pytest.fixture(scope="module")
def validation() -> list[ValidationRow]:
    if not VIDUR_DIR.is_dir():
        pytest.skip(f"Vidur profiling data not found at {VIDUR_DIR}")
    return validate_roofline(VIDUR_DIR)


# ------------------------------------------------------------------ committed profiles


def test_every_expected_profile_is_committed_and_loads() -> None:
    names = set(profile_names())
    assert set(EXPECTED) <= names
    for name, tp in EXPECTED.items():
        p = load_profile(name)
        assert p.tp == tp and p.name == name
        assert "Vidur" in p.source and "MIT" in p.source
        assert p.kv_capacity_tokens(0.9) >= max(p.model.max_context, 16384)
        groups = p.fit_report["groups"]
        assert "non_attention" in groups and "decode_attention" in groups
        cm = p.cost_model()
        assert cm.prefill_time(1024) > 0 and cm.decode_time(16, 16 * 1024) > 0


def test_profiles_with_derived_terms_say_so() -> None:
    for name in EXPECTED:
        p = load_profile(name)
        derived = "derived_from" in p.fit_report["groups"]["decode_attention"]
        assert derived == (name != "llama-2-70b-a100x2")
        assert ("DERIVED" in p.source) == (derived or (p.gpu.name.startswith("A40") and p.tp > 1))
        if p.tp > 1:
            assert p.coefficients.comm_intercept > 0 and p.coefficients.comm_per_token > 0
            measured = "all_reduce" in p.fit_report["groups"]
            assert measured != ("all_reduce" in p.fit_report.get("derived_terms", {}))
            assert measured == (not p.gpu.name.startswith("A40"))
        else:
            assert p.coefficients.comm_intercept == 0


def test_derived_attention_scales_with_gpu_specs() -> None:
    a100, h100 = load_profile("llama-2-7b-a100"), load_profile("llama-2-7b-h100")
    a, h = gpu_spec("a100-80gb"), gpu_spec("h100-80gb")
    bw = a.hbm_bytes_per_s / h.hbm_bytes_per_s
    peak = a.peak_tflops(2) / h.peak_tflops(2)
    ca, ch = a100.coefficients, h100.coefficients
    assert ch.per_decode_kv == pytest.approx(ca.per_decode_kv * bw, rel=1e-4)
    assert ch.per_prefill_work == pytest.approx(ca.per_prefill_work * peak, rel=1e-4)
    assert ch.decode_intercept == pytest.approx(ca.decode_intercept, rel=1e-4)
    # GQA: Llama-3-8B reads 4× less KV per token than Llama-2-7B (8 vs 32 KV heads)
    l3 = load_profile("llama-3-8b-a100").coefficients
    assert l3.per_decode_kv == pytest.approx(ca.per_decode_kv / 4, rel=1e-4)


def test_h100_profiles_are_faster_than_a100() -> None:
    for model in ("llama-2-7b", "codellama-34b", "phi-2"):
        a, h = (
            load_profile(f"{model}-a100").cost_model(),
            load_profile(f"{model}-h100").cost_model(),
        )
        assert h.prefill_time(2048) < a.prefill_time(2048)
        assert h.decode_time(32, 32 * 1024) < a.decode_time(32, 32 * 1024)


# ------------------------------------------------------------------ against the shared data


@needs_vidur
def test_one_profile_per_vidur_pair_with_the_expected_tp(
    calibrated: dict[str, ReplicaProfile],
) -> None:
    assert len(vidur_pairs(VIDUR_DIR)) == len(EXPECTED)
    assert {n: p.tp for n, p in calibrated.items()} == EXPECTED


@needs_vidur
def test_committed_yaml_is_current(calibrated: dict[str, ReplicaProfile]) -> None:
    """What ``scripts/fit_vidur_profiles.py --check`` verifies."""
    profile_dir = REPO / "src" / "sloserve" / "costmodel" / "profiles"
    stale = [
        n for n, p in calibrated.items() if (profile_dir / f"{n}.yaml").read_text() != render(p)
    ]
    assert not stale, f"rerun scripts/fit_vidur_profiles.py: stale {stale}"


@needs_vidur
def test_held_out_median_error_under_10_percent(calibrated: dict[str, ReplicaProfile]) -> None:
    lines = []
    for name, p in calibrated.items():
        for group, rep in p.fit_report["groups"].items():
            assert rep["n_test"] > 0, (name, group)
            bound = ABOVE_10_PERCENT.get((name, group), 0.10)
            lines.append(
                f"{name:22} {group:18} held-out median {rep['median_rel_err']:6.1%}"
                + (" (derived)" if "derived_from" in rep else "")
            )
            assert rep["median_rel_err"] < bound, (name, group, rep["median_rel_err"])
            assert rep["r2"] > R2_BELOW_095.get((name, group), 0.95), (name, group, rep["r2"])
    print("\n".join(lines))


@needs_vidur
def test_attention_calibration_is_plausible() -> None:
    cal = calibrate_attention(VIDUR_DIR)
    assert 0.5 < cal.decode_bw_eff < 1.0
    assert 0.2 < cal.prefill_flops_eff < 0.7
    # the roofline's documented defaults are within 15% of the calibrated efficiencies
    assert DEFAULT_PARAMS.attn_decode_bw_eff == pytest.approx(cal.decode_bw_eff, rel=0.15)
    assert DEFAULT_PARAMS.attn_prefill_flops_eff == pytest.approx(cal.prefill_flops_eff, rel=0.15)
    params = cal.roofline_params()
    assert params.attn_decode_latency_s == pytest.approx(cal.decode.intercept_ms * 1e-3)


@needs_vidur
def test_roofline_against_all_vidur_measurements(validation: list[ValidationRow]) -> None:
    print()
    print("Roofline (default parameters) vs Vidur's measurements, relative error:")
    print(format_table(validation))
    summary = group_summary(validation)
    assert set(summary) == set(GROUPS)
    assert summary["non_attention"]["configs"] == 71
    for group in ("non_attention", "decode_attention", "prefill_attention"):
        assert summary[group]["median_rel_err"] < 0.5, group
    for group in ("all_reduce_nvlink", "all_reduce_pcie"):
        assert summary[group]["median_rel_err"] < 0.5, group
    # every model/GPU/TP separately, too
    for row in validation:
        if row.group != "all_reduce_cross_node":
            assert row.median_rel_err < 0.5, (row.group, row.config, row.median_rel_err)
    # in fact much better than the bound where it matters most
    assert summary["non_attention"]["median_rel_err"] < 0.1


@needs_vidur
def test_calibrated_profiles_record_their_roofline_error(
    calibrated: dict[str, ReplicaProfile],
) -> None:
    p = calibrated["llama-2-70b-a100x2"].fit_report["roofline_error"]
    assert {"non_attention", "decode_attention", "prefill_attention", "all_reduce_nvlink"} <= set(p)
    assert "non_attention" in calibrated["phi-2-a40"].fit_report["roofline_error"]
