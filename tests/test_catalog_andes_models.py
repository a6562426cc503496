"""The catalog entries Andes evaluates on (Andes §6.1, Table 1): Llama-3.1-70B and
Phi-3.5-MoE, checked against numbers typed in from their published config.json files."""

from __future__ import annotations

import pytest

from sloserve.costmodel import load_profile
from sloserve.costmodel.catalog import gpu_spec, model_entry, model_key, model_spec
from sloserve.costmodel.profile import kv_capacity


def test_llama_3_1_70b_matches_its_config_json() -> None:
    e = model_entry("llama-3.1-70b")
    assert e.source == "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json"
    m = e.spec
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads) == (80, 8192, 64, 8)
    assert (m.intermediate_size, m.vocab_size, m.max_context) == (28672, 128256, 131072)
    assert not m.is_moe and not m.tied_embeddings
    # 70,553,706,496 parameters (Hub safetensors metadata); the shapes give the same count
    assert m.param_count() == 70_553_706_496
    assert m.params_b == pytest.approx(70.55)
    # K and V: 2 × 80 layers × 8 KV heads × 128 head dim × 2 bytes
    assert m.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert model_key("meta-llama/Llama-3.1-70B") == model_key("llama3.1-70b") == "llama-3.1-70b"


def test_phi_3_5_moe_matches_its_config_json() -> None:
    e = model_entry("phi-3.5-moe")
    assert e.source.startswith("https://huggingface.co/microsoft/Phi-3.5-MoE-instruct/")
    m = e.spec
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads) == (32, 4096, 32, 8)
    assert (m.intermediate_size, m.vocab_size, m.max_context) == (6400, 32064, 131072)
    assert (m.num_experts, m.experts_per_token) == (16, 2) and m.is_moe
    # the model card: 41.9 B parameters in all, 6.6 B active with 2 of 16 experts
    assert m.param_count() / 1e9 == pytest.approx(41.87, abs=0.01)
    assert m.params_b == pytest.approx(41.87)
    h, L = m.hidden_size, m.num_layers
    attention = h * h * 2 + h * (m.num_kv_heads * m.head_dim) * 2
    expert = 3 * h * m.intermediate_size
    active = L * (attention + m.experts_per_token * expert) + 2 * m.vocab_size * h
    assert active / 1e9 == pytest.approx(6.6, abs=0.05)
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072


@pytest.mark.parametrize(
    ("name", "tp", "tokens"),
    # 90% of tp × 40 GiB, less the weights and 1 GiB per GPU, over the KV bytes per token
    [("llama-3.1-70b", 8, 486_900), ("llama-3.1-70b", 4, 28_148), ("phi-3.5-moe", 8, 1_654_874)],
)
def test_andes_testbed_profiles_price_from_the_specs(name: str, tp: int, tokens: int) -> None:
    m, g = model_spec(name), gpu_spec("a100-40gb")
    expected = (0.9 * 40 * 2**30 * tp - m.weight_bytes - tp * 2**30) / m.kv_bytes_per_token
    assert kv_capacity(m, g, tp) == pytest.approx(expected, abs=tp * 16 + 1)
    p = load_profile(f"{name}@a100-40gbx{tp}")
    assert p.tp == tp and p.model == m
    assert p.kv_capacity_tokens() == tokens
    # a decode step of 32 requests costs more than one of 1
    assert p.cost_model().decode_time(32, 32 * 2048) > p.cost_model().decode_time(1, 2048)
