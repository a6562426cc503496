"""Fitting measured-iteration CSVs: recovery, reports, BROS/Aladdin forms, errors, profiles."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel import BatchStats, LinearCoefficients, LinearCostModel, load_profile
from sloserve.costmodel.fit import (
    aladdin_coefficients,
    bros_coefficients,
    fit_profile_csv,
    fit_profile_frame,
    format_fit_report,
    profile_from_coefficients,
    profile_from_csv,
    read_profile_csv,
    write_profile_yaml,
)

TRUTH = LinearCoefficients(
    token_floor=8e-3,
    token_intercept=4e-3,
    per_token=5e-5,
    decode_intercept=5e-4,
    per_decode_seq=2e-6,
    per_decode_kv=3e-7,
    prefill_intercept=7e-4,
    per_prefill_work=4e-9,
)
INPUTS = [
    "num_prefill_tokens",
    "num_prefill_seqs",
    "prefill_attn_work",
    "num_decode",
    "decode_context_sum",
]
MODEL = ModelSpec(
    name="toy-1b",
    num_layers=16,
    hidden_size=2048,
    num_heads=16,
    num_kv_heads=4,
    intermediate_size=5632,
    vocab_size=32000,
    params_b=1.1,
)
GPU = GPUSpec(name="toy-gpu", memory_gib=24)


def _grid() -> pd.DataFrame:
    rows: list[dict[str, int]] = []
    for c in (16, 32, 64, 128, 256, 512, 1024, 2048):
        for ctx in (0, 256, 1024, 3072):
            rows.append(dict(zip(INPUTS, (c, 1, c * (c + ctx), 0, 0), strict=True)))
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for ctx in (128, 512, 1024, 2048):
            rows.append(dict(zip(INPUTS, (0, 0, 0, b, b * ctx), strict=True)))
    for b in (4, 32, 128):
        for c in (64, 256, 512):
            rows.append(dict(zip(INPUTS, (c, 1, c * (c + 512), b, b * 1024), strict=True)))
    return pd.DataFrame(rows)


def synthetic(
    coef: LinearCoefficients = TRUTH, noise: float = 0.01, groups: bool = False, seed: int = 0
) -> pd.DataFrame:
    """Times from ``coef`` × (1 + noise·N(0,1)); per-group attention columns if ``groups``."""
    rng = np.random.default_rng(seed)
    df = _grid()
    cm = LinearCostModel(coef)
    stats = [BatchStats(*map(int, r)) for r in df[INPUTS].itertuples(index=False)]
    total = np.array([cm.batch_time(s) for s in stats])
    dec = np.array(
        [
            coef.decode_intercept
            + coef.per_decode_seq * s.num_decode
            + coef.per_decode_kv * s.decode_context_sum
            if s.num_decode
            else np.nan
            for s in stats
        ]
    )
    pre = np.array(
        [
            coef.prefill_intercept
            + coef.per_prefill_seq * s.num_prefill_seqs
            + coef.per_prefill_work * s.prefill_attn_work
            if s.num_prefill_tokens
            else np.nan
            for s in stats
        ]
    )

    def noisy(x: np.ndarray) -> np.ndarray:
        return x * (1 + noise * rng.standard_normal(x.size))

    df["time_s"] = noisy(total)
    if groups:
        df["time_decode_attention_s"] = noisy(dec)
        df["time_prefill_attention_s"] = noisy(pre)
        parts = np.nan_to_num(df["time_decode_attention_s"]) + np.nan_to_num(
            df["time_prefill_attention_s"]
        )
        df["time_s"] = np.maximum(df["time_s"], parts * 1.01)
    return df


def write_csv(tmp_path: Path, df: pd.DataFrame, name: str = "p.csv") -> Path:
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def predict(coef: LinearCoefficients, df: pd.DataFrame) -> np.ndarray:
    cm = LinearCostModel(coef)
    return np.array(
        [cm.batch_time(BatchStats(*map(int, r))) for r in df[INPUTS].itertuples(index=False)]
    )


# ----------------------------------------------------------------- recovery


@pytest.mark.parametrize("field", [f for f, v in TRUTH.model_dump().items() if v])
def test_per_group_fit_recovers_coefficients(field: str) -> None:
    coef, report = fit_profile_frame(synthetic(groups=True))
    assert report["mode"] == "per-group"
    got, want = getattr(coef, field), getattr(TRUTH, field)
    # The decode per-sequence term is small next to the KV term; it is recovered less tightly.
    tol = 0.25 if field == "per_decode_seq" else 0.05
    assert got == pytest.approx(want, rel=tol), field


def test_per_group_fit_is_exact_without_noise() -> None:
    coef, report = fit_profile_frame(synthetic(noise=0.0, groups=True))
    for field, want in TRUTH.model_dump().items():
        assert getattr(coef, field) == pytest.approx(want, rel=1e-4, abs=1e-12), field
    assert report["total"]["max_rel_err"] < 1e-4


def test_total_fit_predicts_held_out_batches() -> None:
    df = synthetic(noise=0.01)
    coef, report = fit_profile_frame(df)
    assert report["mode"] == "total"
    assert report["groups"] == {}
    assert report["total"]["median_rel_err"] < 0.02
    assert report["total"]["r2"] > 0.99
    # The attention slopes are identifiable from totals alone.
    assert coef.per_decode_kv == pytest.approx(TRUTH.per_decode_kv, rel=0.1)
    assert coef.per_prefill_work == pytest.approx(TRUTH.per_prefill_work, rel=0.1)
    assert coef.per_token == pytest.approx(TRUTH.per_token, rel=0.1)
    assert coef.token_floor == pytest.approx(TRUTH.token_floor, rel=0.1)
    truth = predict(TRUTH, df)
    assert np.median(np.abs(predict(coef, df) - truth) / truth) < 0.01


def test_total_fit_without_noise_reproduces_every_batch() -> None:
    df = synthetic(noise=0.0)
    coef, report = fit_profile_frame(df)
    truth = predict(TRUTH, df)
    assert np.max(np.abs(predict(coef, df) - truth) / truth) < 1e-4
    assert report["dropped_terms"] == ["per_prefill_seq"]  # one sequence per chunk


def test_csv_and_frame_fits_agree_and_duplicates_merge(tmp_path: Path) -> None:
    df = synthetic(groups=True)
    doubled = pd.concat([df, df], ignore_index=True)
    c1, r1 = fit_profile_csv(write_csv(tmp_path, doubled))
    c2, r2 = fit_profile_frame(df)
    assert c1 == c2
    assert r1["rows"] == 2 * len(df) and r1["points"] == len(df) == r2["points"]


# ----------------------------------------------------------------- reports


def _check_metrics(g: dict[str, Any]) -> None:
    for key in ("r2", "median_rel_err", "p90_rel_err", "max_rel_err"):
        assert isinstance(g[key], float) and math.isfinite(g[key]), key
    assert g["n_train"] > 0 and g["n_test"] > 0


def test_per_group_report_has_errors_for_every_group_and_total() -> None:
    df = synthetic(groups=True)
    df["time_comm_s"] = 1e-4 + 2e-8 * (df["num_prefill_tokens"] + df["num_decode"])
    df["time_s"] += df["time_comm_s"]
    coef, report = fit_profile_frame(df)
    assert set(report["groups"]) == {
        "decode_attention",
        "prefill_attention",
        "comm",
        "non_attention",
    }
    for g in report["groups"].values():
        _check_metrics(g)
        assert "form" in g and "target" in g
    _check_metrics(report["total"])
    assert set(report["total"]["by_kind"]) == {"decode_only", "prefill_only", "hybrid"}
    assert report["groups"]["comm"]["median_rel_err"] < 1e-4
    assert coef.comm_intercept == pytest.approx(1e-4, rel=1e-4)
    assert coef.comm_per_token == pytest.approx(2e-8, rel=1e-4)
    assert report["groups"]["decode_attention"]["r2"] > 0.99
    text = format_fit_report(report)
    for name in ("decode_attention", "prefill_attention", "non_attention", "total"):
        assert name in text


def test_total_mode_when_attention_columns_miss_a_kind() -> None:
    df = synthetic(groups=True).drop(columns=["time_prefill_attention_s"])
    _, report = fit_profile_frame(df)
    assert report["mode"] == "total"
    assert any("do not cover" in n for n in report["notes"])


def test_report_lists_ignored_columns_and_metadata(tmp_path: Path) -> None:
    df = synthetic(groups=True)
    df["device"] = "toy-gpu"
    df["time_decode_attn_s"] = 1.0  # a typo of a group column
    _, report = fit_profile_csv(write_csv(tmp_path, df))
    assert report["ignored_columns"] == ["time_decode_attn_s"]
    assert report["metadata"] == {"device": "toy-gpu"}


# ----------------------------------------------------------------- BROS and Aladdin


def _random_batches(seed: int, n: int = 200) -> list[BatchStats]:
    """Prefill-only, decode-only and hybrid batches with per-request context (as the engine)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 3
        chunks = [(int(rng.integers(1, 600)), int(rng.integers(0, 2000))) for _ in range(3)]
        chunks = chunks[: int(rng.integers(1, 4))] if kind != 1 else []
        ctxs = [int(rng.integers(1, 4000)) for _ in range(int(rng.integers(1, 64)))]
        ctxs = ctxs if kind != 0 else []
        out.append(
            BatchStats(
                num_prefill_tokens=sum(c for c, _ in chunks),
                num_prefill_seqs=len(chunks),
                prefill_attn_work=sum(c * (c + x) for c, x in chunks),
                num_decode=len(ctxs),
                decode_context_sum=sum(ctxs),
            )
        )
    return out


def test_bros_conversion_prices_batches_as_the_paper() -> None:
    a0p, a1p, bp, a0d, a1d, bd = 6e-5, 2e-9, 4e-3, 9e-5, 3e-7, 6e-3
    cm = LinearCostModel(
        bros_coefficients(
            prefill_alpha0=a0p,
            prefill_alpha1=a1p,
            prefill_beta=bp,
            decode_alpha0=a0d,
            decode_alpha1=a1d,
            decode_beta=bd,
        )
    )
    for s in _random_batches(1):
        # BROS: one α0·Ln + α1·Σ Ln_i·La_i + β per phase present, summed.
        want = 0.0
        if s.num_prefill_tokens:
            want += a0p * s.num_prefill_tokens + a1p * s.prefill_attn_work + bp
        if s.num_decode:
            want += a0d * s.num_decode + a1d * s.decode_context_sum + bd
        assert cm.batch_time(s) == pytest.approx(want, rel=1e-12), s


def test_aladdin_conversion_prices_batches_as_the_paper() -> None:
    k1, c1, k2, c2, c3 = 7e-5, 3e-3, 2.5e-7, 1e-4, 8e-3
    cm = LinearCostModel(aladdin_coefficients(k1=k1, c1=c1, k2=k2, c2=c2, c3=c3))
    for s in _random_batches(2):
        pre = k1 * s.num_prefill_tokens + c1  # t_pre = k1·Σ l_in + c1
        b = s.num_decode
        dec = (k2 * (s.decode_context_sum / b) + c2) * b + c3 if b else 0.0  # (k2·l̄ + c2)·b + c3
        if s.num_prefill_tokens and not b:
            assert cm.batch_time(s) == pytest.approx(pre, rel=1e-12)
        elif b and not s.num_prefill_tokens:
            assert cm.batch_time(s) == pytest.approx(dec, rel=1e-12)
        else:
            assert cm.batch_time(s) == pytest.approx(pre + dec, rel=1e-12)


def test_unrepresentable_or_negative_paper_coefficients_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"c2 .* < k1"):
        aladdin_coefficients(k1=1e-4, c1=0, k2=1e-7, c2=1e-5, c3=0)
    with pytest.raises(ConfigError, match=r"decode_alpha0 .* < prefill_alpha0"):
        bros_coefficients(
            prefill_alpha0=1e-4,
            prefill_alpha1=0,
            prefill_beta=0,
            decode_alpha0=1e-5,
            decode_alpha1=0,
            decode_beta=0,
        )
    with pytest.raises(ConfigError, match="k2 must be"):
        aladdin_coefficients(k1=0, c1=0, k2=-1.0, c2=0, c3=0)


# ----------------------------------------------------------------- malformed CSVs


def _bad_csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    return path


HEADER = (
    "num_prefill_tokens,num_prefill_seqs,prefill_attn_work,num_decode,decode_context_sum,time_s\n"
)
GOOD = "16,1,256,0,0,0.01\n0,0,0,4,400,0.005\n"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (HEADER.replace(",time_s", "") + "16,1,256,0,0\n", "line 1, column(s) time_s: missing"),
        (
            HEADER + GOOD + "16,1,abc,0,0,0.01\n",
            "line 4, column prefill_attn_work: not a number ('abc')",
        ),
        (HEADER + GOOD + "0,0,0,-4,0,0.01\n", "line 4, column num_decode: must be an integer >= 0"),
        (HEADER + GOOD + "\n\n0,0,0,2.5,0,0.01\n", "line 6, column num_decode: must be an integer"),
        (HEADER + GOOD + "16,1,256,0,0,-0.1\n", "line 4, column time_s: must be a finite time > 0"),
        (HEADER + GOOD + "16,1,256,0,0,\n", "line 4, column time_s: empty cell"),
        (HEADER + "16,0,256,0,0,0.01\n", "line 2, column num_prefill_seqs: must be >= 1"),
        (
            HEADER + "16,1,10,0,0,0.01\n",
            "line 2, column prefill_attn_work: must be >= num_prefill_tokens",
        ),
        (HEADER + "0,0,0,0,5,0.01\n", "line 2, column num_prefill_tokens: an empty batch"),
        (HEADER + "0,0,0,0,0,0.01\n", "line 2, column num_prefill_tokens: an empty batch"),
        (HEADER + "0,0,0,3,0,0.01,7\n", "more fields than the header"),
        (
            HEADER.replace("\n", ",time_decode_attention_s\n") + "0,0,0,4,400,0.005,\n",
            "line 2, column time_decode_attention_s: must be > 0 on a row with decode (empty)",
        ),
        (
            HEADER.replace("\n", ",time_decode_attention_s\n") + "0,0,0,4,400,0.005,0.009\n",
            "line 2, column time_decode_attention_s: larger than time_s",
        ),
        (
            HEADER.replace("\n", ",time_prefill_attention_s\n") + "0,0,0,4,400,0.005,0.001\n",
            "line 2, column time_prefill_attention_s: must be empty or 0 on a row without prefill",
        ),
        (
            HEADER.replace("\n", ",device\n") + "16,1,256,0,0,0.01,a100\n0,0,0,4,400,0.005,h100\n",
            "line 3, column device: one profile describes one setting: 'h100' here, 'a100' on line 2",
        ),
        ("", "not a readable CSV"),
    ],
)
def test_malformed_csv_errors_name_file_line_and_column(
    tmp_path: Path, text: str, where: str
) -> None:
    path = _bad_csv(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        fit_profile_csv(path)
    msg = str(e.value)
    assert msg.startswith(str(path)), msg
    assert where in msg, msg


def test_too_few_points_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="2 distinct measured batches; need at least 5"):
        fit_profile_csv(_bad_csv(tmp_path, HEADER + GOOD))
    with pytest.raises(ConfigError, match="not found"):
        fit_profile_csv(tmp_path / "nope.csv")


def test_read_keeps_empty_group_cells_as_not_measured(tmp_path: Path) -> None:
    df = synthetic(groups=True)
    table = read_profile_csv(write_csv(tmp_path, df))
    dec = table.frame["time_decode_attention_s"]
    assert dec.isna().sum() == (df["num_decode"] == 0).sum()


# ----------------------------------------------------------------- profiles


def _with_metadata(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["device"] = GPU.name
    df["device_memory_gib"] = GPU.memory_gib
    df["dtype"] = "bfloat16"
    df["tp"] = 1
    df["model"] = MODEL.name
    for f, v in MODEL.model_dump().items():
        if f != "name":
            df["model_" + f] = v
    return df


def test_fitted_profile_yaml_round_trips_through_load_profile(tmp_path: Path) -> None:
    csv = write_csv(tmp_path, _with_metadata(synthetic(groups=True)), "my-gpu.csv")
    prof = profile_from_csv(csv)
    assert prof.name == "my-gpu" and prof.model == MODEL and prof.gpu == GPU and prof.tp == 1
    out = write_profile_yaml(prof, tmp_path / "out" / "my-profile.yaml")
    loaded = load_profile(str(out))
    assert loaded == prof
    assert loaded.fit_report["mode"] == "per-group"
    assert "my-gpu.csv" in loaded.source
    cm = loaded.cost_model()
    s = BatchStats(256, 1, 256 * 256, 8, 8 * 1000)
    assert cm.batch_time(s) == pytest.approx(LinearCostModel(TRUTH).batch_time(s), rel=0.05)
    assert loaded.kv_capacity_tokens(0.9) > 0


def test_profile_hardware_from_base_profile_or_arguments(tmp_path: Path) -> None:
    csv = write_csv(tmp_path, synthetic())
    with pytest.raises(ConfigError, match="no model shape"):
        profile_from_csv(csv)
    prof = profile_from_csv(csv, base_profile="llama-2-70b-a100x2", name="mine")
    base = load_profile("llama-2-70b-a100x2")
    assert (prof.model, prof.gpu, prof.tp, prof.name) == (base.model, base.gpu, base.tp, "mine")
    assert "llama-2-70b-a100x2" in prof.source
    prof = profile_from_csv(csv, model=MODEL, gpu=GPU, tp=2)
    assert (prof.model, prof.gpu, prof.tp) == (MODEL, GPU, 2)


def test_bad_metadata_names_its_column(tmp_path: Path) -> None:
    df = _with_metadata(synthetic())
    df["model_num_layers"] = 0
    with pytest.raises(ConfigError, match="column model_num_layers"):
        profile_from_csv(write_csv(tmp_path, df))


def test_profile_from_coefficients_validates() -> None:
    prof = profile_from_coefficients(
        TRUTH, name="x", model=MODEL, gpu=GPU, source="test", fit_report={"a": float("nan")}
    )
    assert prof.fit_report == {"a": None}
    with pytest.raises(ConfigError, match="field tp"):
        profile_from_coefficients(TRUTH, name="x", model=MODEL, gpu=GPU, tp=0, source="t")


def test_profiler_module_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import sloserve.costmodel.profiler as p\n"
        "from sloserve.core.errors import ConfigError\n"
        "spec = p.tiny_llama_spec()\n"
        "assert len(p.profile_grid((16,), (1,), (0, 8))) == 4\n"
        "try:\n"
        "    p.profile_model(spec)\n"
        "except ConfigError as e:\n"
        "    assert 'PyTorch' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
