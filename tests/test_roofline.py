"""Roofline model, spec catalog, profiles from specs, transfer times and ``costmodel show``."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel import BatchStats, load_profile
from sloserve.costmodel.catalog import (
    gpu_entry,
    gpu_names,
    gpu_spec,
    model_entry,
    model_key,
    model_names,
    model_spec,
)
from sloserve.costmodel.profile import (
    kv_capacity,
    profile_from_specs,
    single_request_decode_latency,
)
from sloserve.costmodel.roofline import (
    DEFAULT_PARAMS,
    RooflineCostModel,
    RooflineParams,
    linear_coefficients,
    moe_saturation_tokens,
)
from sloserve.costmodel.show import max_batch_for_tpot, show, show_profile
from sloserve.costmodel.transfer import kv_swap_time, load_times, model_load_time

REQUIRED_MODELS = (
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "mistral-7b",
    "phi-3-mini",
    "qwen2.5-7b",
    "codellama-34b",
    "internlm-20b",
    "qwen-72b",
    "phi-2",
)
REQUIRED_GPUS = ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "a10", "v100", "l4", "a40")


def rm(
    model: str = "llama-2-7b", gpu: str = "a100-80gb", tp: int = 1, **kw: float
) -> RooflineCostModel:
    return RooflineCostModel(model_spec(model), gpu_spec(gpu), tp, RooflineParams(**kw))


# ----------------------------------------------------------------------------- catalog


def test_catalog_has_the_required_models_and_gpus() -> None:
    assert set(REQUIRED_MODELS) <= set(model_names())
    assert set(REQUIRED_GPUS) <= set(gpu_names())


@pytest.mark.parametrize("name", (*REQUIRED_MODELS, "mixtral-8x7b"))
def test_model_params_match_the_shapes_and_cite_config_json(name: str) -> None:
    e = model_entry(name)
    assert e.source.startswith("https://huggingface.co/") and e.source.endswith("config.json")
    spec = e.spec
    assert spec.param_count() / 1e9 == pytest.approx(spec.params_b, rel=0.02)
    assert spec.hidden_size % spec.num_heads == 0


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_gpus_have_roofline_facts_and_cite_a_data_sheet(name: str) -> None:
    e = gpu_entry(name)
    assert "https://" in e.source and ("data sheet" in e.source or "product page" in e.source)
    g = e.spec
    assert g.peak_tflops(2) > 0 and g.hbm_bytes_per_s > 0 and g.pcie_gb_per_s > 0


def test_catalog_facts_spot_checks() -> None:
    """A few data-sheet / config.json numbers, typed in independently of the YAML."""
    assert gpu_spec("a100-80gb").bf16_tflops == 312 and gpu_spec("a100-80gb").hbm_tb_per_s == 2.039
    assert gpu_spec("a100-40gb").hbm_tb_per_s == 1.555
    assert gpu_spec("h100-80gb").bf16_tflops == pytest.approx(989.4)
    assert gpu_spec("h200").memory_gib == 141 and gpu_spec("h200").hbm_tb_per_s == 4.8
    assert gpu_spec("v100").bf16_tflops is None and gpu_spec("v100").peak_tflops(2) == 125
    assert gpu_spec("l4").hbm_tb_per_s == 0.3 and gpu_spec("a10").hbm_tb_per_s == 0.6
    l3 = model_spec("llama-3-8b")
    assert (l3.num_layers, l3.hidden_size, l3.num_kv_heads, l3.vocab_size) == (32, 4096, 8, 128256)
    q = model_spec("qwen2.5-7b")
    assert (q.num_layers, q.hidden_size, q.num_heads, q.num_kv_heads) == (28, 3584, 28, 4)
    assert not model_spec("phi-2").gated_mlp


def test_lookup_by_alias_and_hf_id_case_insensitive() -> None:
    assert model_key("Llama-2-7B") == "llama-2-7b"
    assert model_key("meta-llama/Llama-2-7b-hf") == "llama-2-7b"
    assert gpu_spec("A100") == gpu_spec("a100-80gb")
    assert gpu_spec("h100") == gpu_spec("h100-80gb")


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as e:
        model_spec("llama-9b")
    assert "llama-2-7b" in str(e.value) and "qwen-72b" in str(e.value)
    with pytest.raises(UnknownNameError) as e:
        gpu_spec("b200")
    assert "a100-80gb" in str(e.value) and "l4" in str(e.value)


def test_old_style_specs_still_validate() -> None:
    """Profiles written before the new fields existed keep loading."""
    m = ModelSpec(name="m", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, params_b=0.1)
    assert m.num_experts == 1 and m.gated_mlp
    g = GPUSpec(name="g", memory_gib=16)
    assert g.nvlink_gb_per_s is None and g.link_bytes_per_s(2) == 25e9
    with pytest.raises(ValueError):
        g.peak_tflops(2)


# ----------------------------------------------------------------------------- roofline


def test_decode_step_grows_linearly_with_kv_read() -> None:
    m = rm()
    ctx = np.arange(0, 200_001, 20_000)
    t = np.array([m.decode_time(32, int(c)) for c in ctx])
    assert np.all(np.diff(t) > 0)
    np.testing.assert_allclose(np.diff(t, 2), 0.0, atol=1e-12)
    spec = model_spec("llama-2-7b")
    per_kv = spec.kv_bytes_per_token / (2.039e12 * DEFAULT_PARAMS.attn_decode_bw_eff)
    assert (t[1] - t[0]) / 20_000 == pytest.approx(per_kv, rel=1e-9)


def test_iteration_flat_while_memory_bound_then_linear_per_token() -> None:
    m = rm()
    base = m.non_attention_time(1)
    # reading the weights dominates small batches: 1..32 tokens cost about the same
    for t in (2, 8, 16, 32):
        assert m.non_attention_time(t) == pytest.approx(base, rel=0.05)
    # compute bound: per-token time is flat
    per_token = [m.non_attention_time(t) / t for t in (1024, 2048, 4096, 8192)]
    assert max(per_token) / min(per_token) < 1.05
    # and far below the memory-bound per-token cost at one token
    assert per_token[0] < base / 100


def test_prefill_per_token_time_flat_once_compute_bound() -> None:
    m = rm()
    per_tok = [m.prefill_time(t) / t for t in (512, 1024, 2048)]
    assert max(per_tok) / min(per_tok) < 1.15
    assert m.prefill_time(64) / 64 > 2 * per_tok[0]  # small prompts are memory bound


def test_h100_faster_than_a100_and_tp2_halves_compute() -> None:
    prefill = BatchStats(2048, 1, 2048 * 2048)
    decode = BatchStats(num_decode=64, decode_context_sum=64 * 1024)
    for stats in (prefill, decode):
        assert rm(gpu="h100-80gb").batch_time(stats) < rm(gpu="a100-80gb").batch_time(stats)
        assert rm(gpu="h200").batch_time(stats) <= rm(gpu="h100-80gb").batch_time(stats)
    a, b = rm("llama-2-13b", tp=1), rm("llama-2-13b", tp=2)
    assert b.compute_time(prefill) == pytest.approx(a.compute_time(prefill) / 2, rel=1e-9)
    assert b.batch_time(prefill) < a.batch_time(prefill)
    assert b.all_reduce_time(2048) > 0 and a.all_reduce_time(2048) == 0


def test_all_reduce_is_a_ring_over_the_right_link() -> None:
    m = rm("llama-2-70b", tp=2)
    nbytes = 2048 * 8192 * 2
    link = 300e9 * DEFAULT_PARAMS.allreduce_link_eff
    assert m.all_reduce_once_time(nbytes) == pytest.approx(
        DEFAULT_PARAMS.allreduce_latency_s + nbytes / link
    )
    assert m.num_all_reduces == 161
    four = rm("llama-2-70b", tp=4).all_reduce_once_time(nbytes)
    assert four == pytest.approx(DEFAULT_PARAMS.allreduce_latency_s + 1.5 * nbytes / link)
    # beyond the NVLink domain (A40 bridges pairs) the ring falls back to PCIe
    a40 = gpu_spec("a40")
    assert a40.uses_nvlink(2) and not a40.uses_nvlink(4)
    assert a40.link_bytes_per_s(4) == a40.pcie_gb_per_s * 1e9


def test_run_times_match_single_iterations_exactly() -> None:
    m = rm("llama-3-8b", "h100-80gb", 2)
    stats = BatchStats(256, 1, 256 * (256 + 512), num_decode=24, decode_context_sum=24 * 900)
    runs = m.run_times(stats, 6, prefill_work_step=256 * 256)
    single = [
        m.batch_time(
            dataclasses.replace(
                stats,
                decode_context_sum=stats.decode_context_sum + i * 24,
                prefill_attn_work=stats.prefill_attn_work + i * 256 * 256,
            )
        )
        for i in range(6)
    ]
    assert runs.tolist() == single
    assert m.run_times(BatchStats(), 3).tolist() == [0.0, 0.0, 0.0]
    assert m.batch_time(BatchStats()) == 0.0


def test_swap_time_uses_pcie_per_gpu() -> None:
    m = rm("llama-2-70b", tp=2)
    kv = model_spec("llama-2-70b").kv_bytes_per_token
    assert m.swap_time(1000) == pytest.approx(1000 * kv / (2 * 25e9))
    assert m.swap_time(0) == 0.0


def test_kv_heads_replicate_beyond_their_count() -> None:
    q = model_spec("qwen2.5-7b")  # 4 KV heads
    assert q.kv_bytes_per_token_tp(4) == q.kv_bytes_per_token
    assert q.kv_bytes_per_token_tp(8) == 2 * q.kv_bytes_per_token


def test_moe_reads_more_experts_with_more_tokens() -> None:
    m = rm("mixtral-8x7b", "h100-80gb", 2)
    assert moe_saturation_tokens(model_spec("mixtral-8x7b")) == 9
    assert moe_saturation_tokens(model_spec("llama-2-7b")) == 1
    one, sat = m.non_attention_time(1), m.non_attention_time(16)
    assert sat > 2 * one  # 2 of 8 experts' weights vs (nearly) all of them
    dense_like = rm("mistral-7b", "h100-80gb", 2)  # same attention, one expert
    assert m.non_attention_time(1) > dense_like.non_attention_time(1)


def test_linearisation_follows_the_roofline_for_dense_models() -> None:
    for model, gpu, tp in (("llama-2-7b", "a100-80gb", 1), ("llama-2-70b", "h100-80gb", 4)):
        m = rm(model, gpu, tp)
        lin = linear_coefficients(m)
        assert lin.non_attention_median_rel_err < 0.01
        assert lin.non_attention_max_rel_err < 0.2
        assert lin.single_token_rel_err == pytest.approx(0.0, abs=1e-6)
        p = profile_from_specs(model, gpu, tp)
        cm = p.cost_model()
        for stats in (
            BatchStats(1024, 1, 1024 * 1024),
            BatchStats(num_decode=64, decode_context_sum=64 * 2048),
            BatchStats(512, 2, 512 * 300, num_decode=16, decode_context_sum=16 * 1500),
        ):
            assert cm.batch_time(stats) == pytest.approx(m.batch_time(stats), rel=0.1)


# ----------------------------------------------------------------------------- profiles


def test_spec_profile_names_resolve() -> None:
    p = load_profile("llama-3-8b@h100-80gb")
    assert (p.model.name, p.gpu.name, p.tp) == ("meta-llama/Meta-Llama-3-8B", "H100-80GB", 1)
    assert p.fit_report["kind"] == "roofline" and "config.json" in p.source
    assert p.kv_capacity_tokens(0.9) > 100_000
    p2 = load_profile("mistral-7b@a10x2")
    assert p2.tp == 2 and p2.gpu.name == "A10-24GB"


def test_calibrated_profiles_take_precedence() -> None:
    assert load_profile("llama-2-70b@a100-80gbx2").name == "llama-2-70b-a100x2"
    assert load_profile("Llama-2-7B@A100").name == "llama-2-7b-a100"
    forced = load_profile("roofline:llama-2-7b@a100-80gb")
    assert forced.name == "llama-2-7b@a100-80gb" and forced.fit_report["kind"] == "roofline"


def test_roofline_of_a_calibrated_profile_is_close_to_it() -> None:
    p = load_profile("llama-2-7b-a100")
    roof, cal = p.roofline(), p.cost_model()
    for stats in (
        BatchStats(2048, 1, 2048 * 2048),
        BatchStats(num_decode=1, decode_context_sum=1024),
        BatchStats(num_decode=64, decode_context_sum=64 * 1024),
    ):
        assert roof.batch_time(stats) == pytest.approx(cal.batch_time(stats), rel=0.15)


def test_spec_profile_errors_are_clear() -> None:
    with pytest.raises(UnknownNameError, match=r"valid: .*llama-2-7b"):
        load_profile("llama-9@a100")
    with pytest.raises(UnknownNameError, match=r"valid: .*h100-80gb"):
        load_profile("llama-2-7b@tpu-v5")
    with pytest.raises(ConfigError, match="smallest TP that fits: 2"):
        load_profile("llama-2-70b@h100-80gb")
    with pytest.raises(ConfigError, match="TP must be >= 1"):
        load_profile("llama-2-7b@a100x0")
    with pytest.raises(UnknownNameError, match="MODEL@GPU"):
        load_profile("nonsense-profile")


def test_kv_capacity_helper_matches_profile() -> None:
    p = load_profile("llama-2-7b-a100")
    assert kv_capacity(p.model, p.gpu, p.tp, 0.9) == p.kv_capacity_tokens(0.9)
    assert kv_capacity(model_spec("llama-2-70b"), gpu_spec("a100-80gb"), 1) < 0


def test_single_request_decode_latency_and_aladdin_slo() -> None:
    p = load_profile("llama-2-7b-a100")
    lat = single_request_decode_latency(p, 1024)
    assert lat == p.cost_model().decode_time(1, 1024)
    assert single_request_decode_latency(p.cost_model(), 1024) == lat
    assert 0.005 < lat < 0.05  # ~10 ms per token for a 7B model on an A100
    slo = 1.3 * lat  # Aladdin's decode SLO
    assert p.cost_model().decode_time(8, 8 * 1024) < slo


def test_andes_prefill_throughput_of_the_7b_a100_profile() -> None:
    """Andes quotes ~5,000 prefill tokens/s for a 7B model on an A100; report ours."""
    rows = []
    for name in ("llama-2-7b-a100", "roofline:llama-2-7b@a100-80gb"):
        cm = load_profile(name).cost_model()
        for t in (512, 1024, 2048):
            tps = t / cm.prefill_time(t)
            rows.append(f"{name:32} {t:>5} tokens: {tps:>8,.0f} tokens/s")
            # operator time only (no CPU overhead, no LM head in the calibrated profile):
            # within a factor of ~3 of Andes' end-to-end number
            assert 4_000 < tps < 20_000
    print("\n".join(rows))


# ----------------------------------------------------------------------------- transfer


def test_transfer_times() -> None:
    p = load_profile("llama-2-70b-a100x2")
    assert kv_swap_time(1000, p) == pytest.approx(p.cost_model().swap_time(1000))
    assert kv_swap_time(0, p) == 0.0
    t = load_times(p)
    assert t["gpu"] == 0.0 < t["cpu"] < t["disk"]
    w = p.model.weight_bytes
    assert t["cpu"] == pytest.approx(w / (25e9 * 2))
    assert t["disk"] == pytest.approx(w / 2e9 + w / (25e9 * 2))
    spec = model_spec("llama-2-7b")
    assert model_load_time(spec, "cpu", gpu_spec("h100-80gb")) == pytest.approx(
        spec.weight_bytes / 50e9
    )
    assert model_load_time(spec, "cpu", pcie_gb_per_s=10, tp=2) == pytest.approx(
        spec.weight_bytes / 20e9
    )
    with pytest.raises(UnknownNameError, match="valid: gpu, cpu, disk"):
        model_load_time(spec, "ssd", gpu_spec("a100"))


# ----------------------------------------------------------------------------- show


def test_show_profile_is_json_and_consistent() -> None:
    d = show(model="llama-2-7b", gpu="a100-80gb", tp=1)
    json.dumps(d)
    assert d["profile"] == "llama-2-7b-a100" and d["kind"] == "fitted"
    assert d["kv"]["capacity_tokens"] == load_profile("llama-2-7b-a100").kv_capacity_tokens(0.9)
    grid = np.array(d["decode"]["step_ms"])
    assert grid.shape == (9, 4)
    assert np.all(np.diff(grid, axis=0) > 0) and np.all(np.diff(grid, axis=1) > 0)
    assert [r["tokens"] for r in d["prefill"]] == [512, 2048]
    assert d["max_batch_for_tpot"]["tpot_ms"] == 50
    r = show(profile="roofline:llama-3-8b@h100")
    assert r["kind"] == "roofline" and r["tp"] == 1
    with pytest.raises(ConfigError):
        show()


@pytest.mark.parametrize("context", [512, 1024, 4096])
def test_max_batch_for_tpot_is_the_boundary(context: int) -> None:
    p = load_profile("llama-2-7b-a100")
    cm = p.cost_model()
    m = p.kv_capacity_tokens(0.9)
    b, limit = max_batch_for_tpot(p, context, 0.05, m)
    assert b >= 1 and cm.decode_time(b, b * context) <= 0.05 and b * context <= m
    if limit == "tpot":
        assert cm.decode_time(b + 1, (b + 1) * context) > 0.05
    else:
        assert limit == "kv" and (b + 1) * context > m
    assert max_batch_for_tpot(p, context, 1e-4, m) == (0, "tpot")


def test_show_grid_options() -> None:
    p = profile_from_specs("phi-3-mini", "l4")
    d = show_profile(p, batch_sizes=(1, 4), contexts=(128,), prefill_tokens=(256,), tpot_s=0.1)
    assert d["decode"]["step_ms"][0][0] < d["decode"]["step_ms"][1][0]
    assert math.isfinite(d["prefill"][0]["tokens_per_s"])
    assert list(itertools.chain(*d["decode"]["fits_kv"])) == [True, True]
