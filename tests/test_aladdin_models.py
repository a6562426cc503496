"""Aladdin §3 performance models and §4.1 worker configuration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sloserve.cli import app
from sloserve.cluster.aladdin import (
    PerfSamples,
    fit_all_reduce,
    fit_models,
    fit_profile,
    samples_from_csv,
    worker_config_for,
)
from sloserve.cluster.aladdin.lengths import LengthPredictor
from sloserve.core.errors import ConfigError

VIDUR = Path(__file__).resolve().parents[2] / "shared" / "vidur-profiling"
needs_vidur = pytest.mark.skipif(not VIDUR.is_dir(), reason="no shared/vidur-profiling")


def _synthetic(rng: np.random.Generator, noise: float = 0.0) -> PerfSamples:
    pb = rng.integers(1, 9, 60).astype(float)
    pt = rng.integers(100, 4000, 60).astype(float)
    db = rng.integers(2, 200, 80).astype(float)
    dc = db * rng.integers(50, 3000, 80)
    kt = rng.integers(20, 4000, 50).astype(float)
    jitter = lambda n: 1 + noise * rng.standard_normal(n)  # noqa: E731
    return PerfSamples(
        pb,
        pt,
        (2e-4 * pt + 0.02) * jitter(60),
        db,
        dc,
        (1e-7 * dc + 3e-4 * db + 0.03) * jitter(80),
        kt,
        (3e-4 * kt + 0.002) * jitter(50),
    )


_DECODE_KV = ("decode_batch", "decode_context", "decode_s", "kv_tokens", "kv_gib")


def test_fits_recover_known_coefficients() -> None:
    m = fit_models(_synthetic(np.random.default_rng(1)))
    assert m.k1 == pytest.approx(2e-4) and m.c1 == pytest.approx(0.02)
    assert (m.k2, m.c2, m.c3) == pytest.approx((1e-7, 3e-4, 0.03))
    assert (m.h, m.j) == pytest.approx((3e-4, 0.002))
    assert max(m.max_error.values()) < 1e-9
    noisy = fit_models(_synthetic(np.random.default_rng(1), noise=0.02))
    assert 0.01 < noisy.max_error["decode"] < 0.2


def test_prefill_fit_has_a_floor_below_the_knee() -> None:
    """Eq. 2 with a floor: flat (a pass over the weights) below the knee, the line above."""
    rng = np.random.default_rng(3)
    s = _synthetic(rng)
    pt = np.concatenate([[16.0, 32.0, 64.0, 96.0], s.prefill_tokens])
    ps = np.maximum(2e-4 * pt + 0.02, 0.05)  # knee at 150 tokens
    hockey = PerfSamples(np.ones_like(pt), pt, ps, *(getattr(s, f) for f in _DECODE_KV))
    m = fit_models(hockey)
    assert m.c0 == pytest.approx(0.05)
    assert (m.k1, m.c1) == pytest.approx((2e-4, 0.02))
    assert m.prefill_s(16) == pytest.approx(0.05) and m.prefill_s(1000) == pytest.approx(0.22)
    assert m.max_error["prefill"] < 1e-9 and m.prefill_s(0) == 0.0


def test_prefill_knee_is_chosen_by_the_fit_error() -> None:
    """A floor that rises gently (as the 70B's PCIe all-reduces make it) before a line that
    attention bends upwards: the knee chosen has the smallest largest error of all the
    candidates, and here it is below 1.25 (9.9 % against 10.8 %)."""
    from sloserve.cluster.aladdin import perf_models as pm

    rng = np.random.default_rng(4)
    s = _synthetic(rng)
    pt = np.concatenate([[16.0, 32.0, 64.0, 100.0, 104.0, 120.0], np.linspace(150, 4000, 30)])
    ps = np.maximum(0.05 + 3e-5 * (pt - 16), 4e-4 * pt + 0.02 + 3e-8 * pt**2)
    samples = PerfSamples(np.ones_like(pt), pt, ps, *(getattr(s, f) for f in _DECODE_KV))
    m = fit_models(samples)
    assert m.knee in pm.KNEES and m.report()["prefill"]["knee"] == m.knee
    fixed = pm._rel(np.maximum(m.k1 * pt + m.c1, m.c0), ps).max()
    assert m.max_error["prefill"] == pytest.approx(fixed)
    old, errors = pm.KNEES, {}
    try:
        for knee in old:
            pm.KNEES = (knee,)
            errors[knee] = fit_models(samples).max_error["prefill"]
    finally:
        pm.KNEES = old
    assert m.max_error["prefill"] == pytest.approx(min(errors.values()))
    assert m.knee < 1.25 and errors[1.25] > m.max_error["prefill"] + 0.005


def test_prefill_fit_of_the_70b_pcie_worker_is_closer_with_the_chosen_knee() -> None:
    """Llama-2-70B on two PCIe A100s (the headline's worker): the largest prefill error
    over the fit's grid is 8.3 % with the knee chosen by error (10.5 % at a fixed 1.25)."""
    m = fit_profile("llama-2-70b@a100-80gb-pciex2")
    assert m.knee < 1.25 and m.max_error["prefill"] < 0.09


def test_prefill_fit_of_a_profile_charges_short_prompts_what_the_cost_model_does() -> None:
    """Llama-2-7B on the PCIe A100: a straight line went negative below about 60 tokens and
    charged ShareGPT's median prompt 6.4 of 10.8 ms; the floored fit is within 10 % over
    16..1000 prompt tokens (ShareGPT's 99th percentile is about 1,200)."""
    from sloserve.costmodel.base import BatchStats
    from sloserve.costmodel.profile import load_profile

    prof = "llama-2-7b@a100-80gb-pcie"
    m, cm = fit_profile(prof), load_profile(prof).cost_model()
    for n in (16, 50, 149, 224, 400, 1000):
        true = cm.batch_time(
            BatchStats(num_prefill_tokens=n, num_prefill_seqs=1, prefill_attn_work=n * n)
        )
        assert m.prefill_s(n) == pytest.approx(true, rel=0.1), n


def test_context_limit_is_eq4_and_rejects_slo_below_c3() -> None:
    m = fit_models(_synthetic(np.random.default_rng(2)))
    ld = m.context_limit(10, 0.075)
    assert m.decode_s(10, ld) == pytest.approx(0.075)
    assert m.max_batch(0.075, 500) == int((0.075 - 0.03) / (1e-7 * 500 + 3e-4))
    with pytest.raises(ConfigError, match=r"slo_atgt_ms.*c3"):
        m.context_limit(4, 0.02)


def test_fit_from_cost_model_and_csv(tmp_path: Path) -> None:
    m = fit_profile("llama-2-7b-a100")
    assert m.k1 > 0 and m.k2 > 0 and m.max_error["kv"] < 0.03 and m.mean_error["decode"] < 0.05
    csv = tmp_path / "s.csv"
    rows = ["kind,batch_size,tokens,value"]
    rows += [f"prefill,1,{t},{1e-4 * t + 0.01}" for t in (100, 200, 400)]
    rows += [f"decode,{b},{b * 300},{1e-7 * b * 300 + 2e-4 * b + 0.02}" for b in (2, 8, 32, 64)]
    rows += [f"kv,1,{t},{2e-4 * t + 1e-3}" for t in (300, 600)]
    csv.write_text("\n".join(rows) + "\n")
    got = fit_models(samples_from_csv(csv))
    assert got.k1 == pytest.approx(1e-4) and got.c3 == pytest.approx(0.02)
    csv.write_text("kind,batch_size,tokens,value\nprefil,1,2,3\n")
    with pytest.raises(ConfigError, match="kind 'prefil'"):
        samples_from_csv(csv)


def test_length_predictor_conditions_on_prompt_and_repredicts() -> None:
    prompts = [10] * 50 + [1000] * 50
    outputs = [20] * 25 + [40] * 25 + [300] * 50
    lp = LengthPredictor(prompts, outputs, bins=2)
    assert lp.predict(10) == 30 and lp.predict(1000) == 300
    assert lp.repredict(10, 30) == 40  # the mean of the bin's outputs longer than 30
    assert lp.repredict(10, 45) == 46


@needs_vidur
def test_all_reduce_grows_with_gpus() -> None:
    f = fit_all_reduce(VIDUR)
    assert f.alpha_s > 0 and f.beta_s_per_byte > 0
    assert f.time(1 << 20, 1) == 0 < f.time(1 << 20, 2) < f.time(1 << 20, 4) < f.time(1 << 20, 8)


@needs_vidur
@pytest.mark.parametrize(
    ("model", "gpu", "atgt_ms", "link", "best"),
    [
        ("llama-2-70b", "a100", 75, "pcie", 2),  # Table 3; the A100 testbed is PCIe
        ("llama-2-13b", "a100", 30, "pcie", 1),
        ("llama-2-7b", "a100", 15, "pcie", 1),
        ("llama-2-13b", "v100", 50, "nvlink", 2),
    ],
)
def test_table3_worker_configurations(
    model: str, gpu: str, atgt_ms: float, link: str, best: int
) -> None:
    wc = worker_config_for(
        model, gpu, [1, 2, 4], atgt_s=atgt_ms / 1e3, link=link, vidur_dir=str(VIDUR)
    )
    assert wc.best_gpus == best


@needs_vidur
def test_cli_fit_and_config_and_bad_input() -> None:
    r = CliRunner().invoke(app, ["aladdin", "fit", "--profile", "llama-2-7b-a100", "--json"])
    assert r.exit_code == 0 and '"k1_s_per_token"' in r.output
    args = [
        "aladdin",
        "config",
        "--model",
        "llama-2-70b",
        "--gpu",
        "a100",
        "--tp",
        "1,2,4",
        "--slo-atgt-ms",
        "75",
        "--link",
        "pcie",
        "--vidur-dir",
        str(VIDUR),
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "best: 2 GPU(s) per worker" in r.output
    for bad, msg in ((["--tp", "16"], "tp: 16"), (["--tp", "x"], "tp: 'x'")):
        r = CliRunner().invoke(app, [*args, *bad])
        assert r.exit_code != 0 and msg in str(r.exception), r.output
