"""Profiling a tiny random Llama on the CPU, then fitting and pricing with the result.

Timing tests on a shared machine: the grid is small, passes are single-threaded
(``cpu_threads=1``) and interleaved, and every timing assertion is loose.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import ModelSpec
from sloserve.costmodel import BatchStats, load_profile
from sloserve.costmodel.fit import (
    fit_profile_csv,
    fit_profile_frame,
    profile_from_csv,
    read_profile_csv,
    write_profile_yaml,
)
from sloserve.costmodel.fit.profile_csv import CSV_INPUT_COLUMNS
from sloserve.costmodel.profiler import (
    IterationShape,
    LlamaModel,
    llama_param_count,
    profile_grid,
    profile_model,
    tiny_llama_spec,
    write_profile_csv,
)

PREFILL = (16, 64, 256)
DECODE = (1, 4, 16, 64)
CONTEXTS = (0, 128, 512)


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_profile(torch: Any) -> pd.DataFrame:
    return profile_model(
        tiny_llama_spec(),
        device="cpu",
        prefill_chunks=PREFILL,
        decode_batches=DECODE,
        contexts=CONTEXTS,
        repeats=5,
        warmup=1,
        cpu_threads=1,
    )


def test_profile_has_the_csv_columns_and_the_grid(tiny_profile: pd.DataFrame) -> None:
    df = tiny_profile
    assert list(df.columns[:6]) == [*CSV_INPUT_COLUMNS, "time_s"]
    for col in (
        "time_decode_attention_s",
        "time_prefill_attention_s",
        "time_non_attention_s",
        "device",
        "model",
        "dtype",
        "model_num_layers",
        "device_memory_gib",
    ):
        assert col in df.columns, col
    n_pre, n_dec = len(PREFILL) * len(CONTEXTS), len(DECODE) * 2
    assert len(df) == n_pre + n_dec + len(DECODE) * len(PREFILL)
    assert df["kind"].value_counts().to_dict() == {
        "prefill": n_pre,
        "decode": n_dec,
        "hybrid": len(DECODE) * len(PREFILL),
    }
    assert (df["time_s"] > 0).all()
    assert (df["time_min_s"] <= df["time_s"]).all() and (df["time_s"] <= df["time_max_s"]).all()
    # Groups come from the median repeat: they never add up to more than its total.
    attn = df["time_decode_attention_s"].fillna(0) + df["time_prefill_attention_s"].fillna(0)
    assert (attn < df["time_s"]).all()
    assert np.allclose(attn + df["time_non_attention_s"], df["time_s"])
    assert df["time_decode_attention_s"].isna().tolist() == (df["num_decode"] == 0).tolist()
    pre = df[df["kind"] == "prefill"]
    chunk_ctx = {(int(r.num_prefill_tokens), int(r.prefill_attn_work)) for r in pre.itertuples()}
    assert chunk_ctx == {(c, c * (c + x)) for c in PREFILL for x in CONTEXTS}
    assert df["dtype"].iloc[0] == "float32" and df["model_dtype_bytes"].iloc[0] == 4


def test_more_decode_tokens_are_never_much_faster(tiny_profile: pd.DataFrame) -> None:
    # The fastest repeat of each shape: interference from other processes only ever adds
    # time, so the minimum is the measurement's least noisy figure (a mean of medians let
    # one slow spell on a loaded machine make batch 1 "slower" than batch 4).
    dec = tiny_profile[tiny_profile["kind"] == "decode"]
    mean_by_batch = dec.groupby("num_decode")["time_min_s"].min().sort_index()
    assert list(mean_by_batch.index) == list(DECODE)
    for small, large in zip(mean_by_batch.to_numpy(), mean_by_batch.to_numpy()[1:], strict=False):
        assert large > 0.7 * small, mean_by_batch.to_dict()
    assert mean_by_batch.iloc[-1] > mean_by_batch.iloc[0]
    pre = tiny_profile[tiny_profile["kind"] == "prefill"]
    by_chunk = pre.groupby("num_prefill_tokens")["time_min_s"].min().sort_index()
    assert by_chunk.iloc[-1] > by_chunk.iloc[0], by_chunk.to_dict()


def test_fit_of_the_profile_reports_r2_and_errors(tiny_profile: pd.DataFrame) -> None:
    coef, report = fit_profile_frame(tiny_profile)
    assert report["mode"] == "per-group"
    assert set(report["groups"]) == {"decode_attention", "prefill_attention", "non_attention"}
    for g in [*report["groups"].values(), report["total"]]:
        for key in ("r2", "median_rel_err", "p90_rel_err", "max_rel_err"):
            assert isinstance(g[key], float) and math.isfinite(g[key]), key
        assert g["n_test"] > 0
    # Loose: CPU timings of a tiny model are noisy, but the decomposition must hold up.
    assert report["total"]["median_rel_err"] < 0.5
    assert coef.per_decode_kv > 0 or coef.per_decode_seq > 0


def test_profile_csv_fits_into_a_loadable_profile(
    tiny_profile: pd.DataFrame, tmp_path: Path
) -> None:
    csv = write_profile_csv(tiny_profile, tmp_path / "tiny-cpu.csv")
    table = read_profile_csv(csv)
    assert table.ignored_columns == ()
    assert table.metadata["model"] == "tiny-llama"
    c1, _ = fit_profile_csv(csv)
    c2, _ = fit_profile_frame(tiny_profile)
    for field, v in c1.model_dump().items():  # the CSV keeps 9 significant digits
        assert getattr(c2, field) == pytest.approx(v, rel=1e-3, abs=1e-12), field
    prof = profile_from_csv(csv)
    assert prof.model == tiny_llama_spec()
    assert prof.gpu.name.startswith("cpu") and prof.gpu.memory_gib > 0
    path = write_profile_yaml(prof, tmp_path / "tiny-cpu.yaml")
    loaded = load_profile(str(path))
    assert loaded == prof
    cm = loaded.cost_model()
    assert cm.batch_time(BatchStats(num_decode=4, decode_context_sum=4 * 100)) > 0
    assert cm.batch_time(BatchStats(128, 1, 128 * 128, 4, 400)) > 0
    assert loaded.kv_capacity_tokens(0.9) > 0


def test_tied_embeddings_and_plain_mlp_change_the_parameter_count(torch: Any) -> None:
    spec = tiny_llama_spec()
    fields = ModelSpec.model_fields
    if "tied_embeddings" not in fields or "gated_mlp" not in fields:
        pytest.skip("this ModelSpec has no tied_embeddings / gated_mlp fields")
    variant = spec.model_copy(update={"tied_embeddings": True, "gated_mlp": False})
    model = LlamaModel(variant)
    shape = dict(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2)
    want = llama_param_count(
        **shape, intermediate_size=256, vocab_size=256, tied_embeddings=True, gated_mlp=False
    )
    assert model.num_parameters == want < LlamaModel(spec).num_parameters
    with torch.inference_mode():
        logits = model.forward(model.prepare(IterationShape(prefill=((4, 0),), decode=(3,))))
    assert tuple(logits.shape) == (2, 256)


def test_tiny_spec_counts_its_parameters(torch: Any) -> None:
    spec = tiny_llama_spec()
    model = LlamaModel(spec)
    assert model.num_parameters == round(spec.params_b * 1e9)
    assert model.num_parameters == llama_param_count(
        num_layers=2,
        hidden_size=128,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=256,
        vocab_size=256,
    )


def test_packed_forward_is_a_causal_lm_with_a_kv_cache(torch: Any) -> None:
    """The cache, rotary positions and masks are right: prefill in one go, prefill as a
    chunk after cached context, and decode after cached context give the same logits."""
    spec = tiny_llama_spec()
    model = LlamaModel(spec, seed=1)
    n, k = 24, 7
    with torch.inference_mode():
        full = model.prepare(IterationShape(prefill=((n, 0),)))
        want = model.forward(full)[0]  # logits after the last of the n tokens
        # The forward wrote the real K/V of all n tokens into full's (per-layer) caches.
        chunk = model.prepare(IterationShape(prefill=((k, n - k),)))
        chunk["ids"] = full["ids"][n - k :].clone()
        dec = model.prepare(IterationShape(decode=(n - 1,)))
        dec["ids"] = full["ids"][n - 1 :].clone()
        for layer in range(spec.num_layers):
            (fk, fv), (ck, cv), (dk, dv) = (
                full["caches"][layer][0],
                chunk["caches"][layer][0],
                dec["caches"][layer][0],
            )
            ck[:, :, : n - k] = fk[:, :, : n - k]
            cv[:, :, : n - k] = fv[:, :, : n - k]
            dk[:, :, : n - 1] = fk[:, :, : n - 1]
            dv[:, :, : n - 1] = fv[:, :, : n - 1]
        got_chunk = model.forward(chunk)[0]
        got_dec = model.forward(dec)[0]
    assert torch.allclose(got_chunk, want, atol=1e-4)
    assert torch.allclose(got_dec, want, atol=1e-4)


def test_fallback_attention_path_matches_the_native_one(torch: Any) -> None:
    """Older torch: KV heads expanded by hand and a dense mask instead of the lower-right
    causal bias. Same logits on a hybrid batch with several chunks and contexts."""
    spec = tiny_llama_spec()
    native, fallback = LlamaModel(spec, seed=3), LlamaModel(spec, seed=3)
    fallback.native_gqa, fallback.lower_right = False, None
    shape = IterationShape(prefill=((9, 0), (5, 20)), decode=(3, 3, 40))
    with torch.inference_mode():
        want = native.forward(native.prepare(shape, seed=1))
        got = fallback.forward(fallback.prepare(shape, seed=1))
    assert tuple(got.shape) == (2 + 3, spec.vocab_size)
    assert torch.allclose(got, want, atol=1e-4)


def test_mixed_decode_contexts_and_several_chunks(torch: Any) -> None:
    shape = IterationShape(prefill=((8, 0), (5, 20)), decode=(3, 3, 40))
    df = profile_model(
        tiny_llama_spec(), shapes=[shape], repeats=1, warmup=0, cpu_threads=1, interleave=False
    )
    row = df.iloc[0]
    assert row["num_prefill_seqs"] == 2 and row["prefill_attn_work"] == 8 * 8 + 5 * 25
    assert row["num_decode"] == 3 and row["decode_context_sum"] == 46
    assert row["kind"] == "hybrid"


def test_profiler_refuses_bad_settings(torch: Any) -> None:
    spec = tiny_llama_spec(max_context=64)
    with pytest.raises(ConfigError, match="max_context 64"):
        profile_model(spec, prefill_chunks=(32,), decode_batches=(1,), contexts=(0, 48))
    with pytest.raises(ConfigError, match="dtype"):
        profile_model(spec, dtype="int4")
    with pytest.raises(ConfigError, match="repeats"):
        profile_model(spec, repeats=0)
    with pytest.raises(ConfigError, match="even head_dim"):
        LlamaModel(tiny_llama_spec(hidden_size=60, num_heads=4, num_kv_heads=2))
    if "num_experts" in ModelSpec.model_fields:
        moe = tiny_llama_spec().model_copy(update={"num_experts": 4})
        with pytest.raises(ConfigError, match="dense"):
            LlamaModel(moe)
    with pytest.raises(ConfigError, match="decode request needs"):
        IterationShape(decode=(0,))
    assert len(profile_grid((16,), (1, 2), (0,))) == 1  # no decode at context 0, no hybrids
