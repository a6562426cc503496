"""The built-in profiles are reproducible fits of Vidur's measured operator timings."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from sloserve.costmodel import BatchStats, load_profile
from sloserve.costmodel.fit import (
    ATTENTION_70B_TP2_CSV,
    MLP_CSV,
    FloorLine,
    fit_builtin_profiles,
    fit_decode_attention,
    fit_floor_line,
    holdout_mask,
    load_attention_tables,
    load_mlp_table,
    relative_lstsq,
)
from sloserve.costmodel.profile import ReplicaProfile

VIDUR_DIR = Path(__file__).resolve().parents[2] / "shared" / "vidur-profiling"
NAMES = ("llama-2-7b-a100", "llama-2-70b-a100x2")

needs_vidur = pytest.mark.skipif(
    not VIDUR_DIR.is_dir(),
    reason=f"Vidur profiling data not found at {VIDUR_DIR} (shared data, not in the repo)",
)


@pytest.fixture(scope="module")
def refit() -> dict[str, ReplicaProfile]:
    if not VIDUR_DIR.is_dir():
        pytest.skip(f"Vidur profiling data not found at {VIDUR_DIR}")
    return fit_builtin_profiles(VIDUR_DIR)


# ----------------------------------------------------------------- fitting primitives


def test_relative_lstsq_recovers_exact_line_and_respects_nonneg() -> None:
    x = np.arange(1.0, 20.0)
    y = 2.0 + 0.5 * x
    coef = relative_lstsq(np.column_stack([np.ones_like(x), x]), y)
    assert coef == pytest.approx([2.0, 0.5])
    # y decreases with x: an unconstrained slope would be negative; constrained, it is 0.
    coef = relative_lstsq(np.column_stack([np.ones_like(x), x]), 30.0 - x, [False, True])
    assert coef[1] == 0.0 and coef[0] > 0


def test_fit_floor_line_recovers_a_synthetic_max_form() -> None:
    truth = FloorLine(floor=10.0, intercept=2.0, slope=0.25)
    x = np.arange(1.0, 400.0, 3.0)
    got = fit_floor_line(x, truth(x))
    assert got.floor == pytest.approx(10.0, rel=1e-6)
    assert got.slope == pytest.approx(0.25, rel=1e-6)
    assert got.knee == pytest.approx(32.0, rel=1e-3)


def test_holdout_is_every_fifth_point() -> None:
    assert holdout_mask(10).tolist() == [False] * 4 + [True] + [False] * 4 + [True]


# ----------------------------------------------------------------- committed profiles


@pytest.mark.parametrize("name", NAMES)
def test_load_profile_works(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert "Vidur" in p.source and "MIT" in p.source
    cm = p.cost_model()
    assert cm.prefill_time(512) > 0
    assert cm.decode_time(8, 8 * 512) > 0


def test_7b_source_says_attention_is_derived() -> None:
    p = load_profile("llama-2-7b-a100")
    assert "DERIVED" in p.source and "Llama-2-70B TP2" in p.source
    assert p.coefficients.comm_intercept == 0 and p.coefficients.comm_per_token == 0


def test_kv_capacity_in_plausible_range() -> None:
    m7 = load_profile("llama-2-7b-a100").kv_capacity_tokens(0.9)
    m70 = load_profile("llama-2-70b-a100x2").kv_capacity_tokens(0.9)
    assert 100_000 <= m7 <= 130_000
    assert 20_000 <= m70 <= 90_000


def test_7b_prefill_throughput_is_thousands_of_tokens_per_s() -> None:
    cm = load_profile("llama-2-7b-a100").cost_model()
    for tokens in (512, 2048):
        tps = tokens / cm.prefill_time(tokens)
        assert 3_000 < tps < 30_000, (tokens, tps)


@pytest.mark.parametrize("name", NAMES)
def test_decode_step_grows_with_batch_and_context(name: str) -> None:
    cm = load_profile(name).cost_model()
    by_batch = [cm.decode_time(b, b * 1024) for b in (1, 32, 128, 256)]
    assert all(a < b for a, b in itertools.pairwise(by_batch))
    by_ctx = [cm.decode_time(32, 32 * c) for c in (128, 1024, 4096)]
    assert all(a < b for a, b in itertools.pairwise(by_ctx))
    runs = cm.decode_run_times(16, 16 * 1000, 5)
    assert np.all(np.diff(runs) > 0)


def test_chunked_prefill_costs_more_with_cached_context() -> None:
    cm = load_profile("llama-2-70b-a100x2").cost_model()
    fresh = cm.batch_time(BatchStats(512, 1, 512 * 512))
    late = cm.batch_time(BatchStats(512, 1, 512 * (512 + 3000)))
    assert late > fresh


# ----------------------------------------------------------------- against the shared data


@needs_vidur
@pytest.mark.parametrize("name", NAMES)
def test_refit_reproduces_committed_coefficients(
    name: str, refit: dict[str, ReplicaProfile]
) -> None:
    committed = load_profile(name)
    fresh = refit[name]
    for field, value in committed.coefficients.model_dump().items():
        assert getattr(fresh.coefficients, field) == pytest.approx(value, rel=1e-4, abs=1e-12), (
            field
        )
    assert fresh.model == committed.model and fresh.gpu == committed.gpu
    assert fresh.tp == committed.tp
    assert fresh.fit_report["groups"].keys() == committed.fit_report["groups"].keys()


@needs_vidur
@pytest.mark.parametrize("name", NAMES)
def test_held_out_median_error_under_10_percent(
    name: str, refit: dict[str, ReplicaProfile]
) -> None:
    groups = refit[name].fit_report["groups"]
    assert groups, name
    for group, rep in groups.items():
        assert rep["n_test"] > 0, group
        assert rep["median_rel_err"] < 0.10, (group, rep["median_rel_err"])
        assert rep["r2"] > 0.95, (group, rep["r2"])


@needs_vidur
def test_7b_linear_ops_match_readme_facts() -> None:
    """README: Llama-2-7B linear ops 0.29/0.30/1.04/8.17 ms per layer at 1/32/512/4096 tokens."""
    p = load_profile("llama-2-7b-a100")
    c = p.coefficients
    layers = p.model.num_layers
    table = load_mlp_table(VIDUR_DIR / MLP_CSV.format(model="Llama-2-7b-hf"), 1, layers)
    for tokens, readme_ms in ((1, 0.29), (32, 0.30), (512, 1.04), (4096, 8.17)):
        measured = float(table.loc[table["num_tokens"] == tokens, "layer_ms"].iloc[0])
        assert measured == pytest.approx(readme_ms, abs=0.06)  # we read the data as the README
        model_ms = max(c.token_floor, c.token_intercept + c.per_token * tokens) / layers * 1e3
        assert model_ms == pytest.approx(readme_ms, rel=0.15), tokens


@needs_vidur
def test_70b_decode_attention_matches_readme_facts() -> None:
    """README: 70B TP2 decode attention at batch 32 is 0.064 ms (KV 1024), 0.192 ms (KV 4032)."""
    p = load_profile("llama-2-70b-a100x2")
    c = p.coefficients
    layers = p.model.num_layers
    for kv, readme_ms in ((1024, 0.064), (4032, 0.192)):
        per_iter = c.decode_intercept + c.per_decode_seq * 32 + c.per_decode_kv * 32 * kv
        assert per_iter / layers * 1e3 == pytest.approx(readme_ms, rel=0.15), kv
    decode, _ = load_attention_tables(VIDUR_DIR / ATTENTION_70B_TP2_CSV)
    fit = fit_decode_attention(decode)
    assert fit.per_kv_ms > 0 and fit.intercept_ms > 0


def test_7b_attention_is_70b_fit_scaled_by_kv_bytes() -> None:
    p7 = load_profile("llama-2-7b-a100").coefficients
    p70 = load_profile("llama-2-70b-a100x2").coefficients
    # per layer: 7B TP1 KV bytes/token/layer/GPU = 2·32·128·2 = 16384; 70B TP2 = 2048.
    ratio = (2 * 32 * 128 * 2) / (2 * 8 * 128 * 2 / 2)
    assert ratio == 8
    assert p7.per_decode_kv / 32 == pytest.approx(ratio * p70.per_decode_kv / 80, rel=1e-4)
    assert p7.decode_intercept / 32 == pytest.approx(p70.decode_intercept / 80, rel=1e-4)
    assert p7.per_prefill_work / 32 == pytest.approx(p70.per_prefill_work / 80, rel=1e-4)


def test_fit_report_lists_errors_per_group() -> None:
    for name in NAMES:
        rep = load_profile(name).fit_report
        for group in rep["groups"].values():
            for key in ("r2", "median_rel_err", "p90_rel_err", "n_train", "n_test"):
                assert key in group
                assert math.isfinite(group[key])
