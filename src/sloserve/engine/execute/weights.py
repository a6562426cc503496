"""Which model execute mode runs: random weights for a spec, or a local Llama checkpoint.

* ``tiny``: a 2-layer Llama-shaped model (:func:`~sloserve.costmodel.profiler.tiny_llama_spec`)
  that runs on a CPU in milliseconds (tests, docs).
* a catalog name (``sloserve models``): that model's shape with random weights, for timing.
* a directory: a Hugging Face Llama-family checkpoint read from disk only: ``config.json``
  (``model_type`` ``llama``; RoPE scaling unsupported), ``*.safetensors`` (``safetensors``)
  and, if present, ``tokenizer.json`` (``tokenizers``) and the chat template, BOS and EOS
  strings of ``tokenizer_config.json``. Its ``eos_token_id`` ends requests.

Checks that make bad input one clear error (:class:`~sloserve.core.errors.ConfigError`):
a missing directory, a non-Llama config, CUDA requested without CUDA, and weights larger
than the device's memory.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.core.hardware import ModelSpec
from sloserve.costmodel.profiler.llama import _DTYPES, GIB, LlamaModel, _torch, tiny_llama_spec

LLAMA_TYPES = ("llama",)
"""``model_type`` values whose checkpoints this loader maps (Llama 1/2/3 without scaling)."""


@dataclass
class LoadedModel:
    """A model ready to run, with what the serving side needs to talk to it."""

    model: LlamaModel
    name: str
    tokenizer: Any | None = None
    """A ``tokenizers.Tokenizer`` when the checkpoint ships ``tokenizer.json``."""
    eos_id: int | None = None
    chat_template: str | None = None
    """The checkpoint's Jinja chat template (``tokenizer_config.json``), if it has one."""
    special_tokens: dict[str, str] = field(default_factory=dict)
    """``bos_token`` and ``eos_token`` as text, for the chat template."""


def resolve_device(device: str) -> Any:
    """A torch device; ConfigError for anything but cpu / cuda[:N], or CUDA without one."""
    torch = _torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device: expected cpu or cuda, got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device: expected cpu or cuda, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine")
    return dev


def device_memory_gib(dev: Any) -> float:
    """Total memory of the device (host RAM for the CPU)."""
    torch = _torch()
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        return float(torch.cuda.get_device_properties(idx).total_memory) / GIB
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return float("inf")


def _dtype(dtype: str | None, dev: Any) -> str:
    name = _DTYPES.get((dtype or ("bfloat16" if dev.type == "cuda" else "float32")).lower())
    if name is None:
        raise ConfigError(f"--dtype: expected one of {', '.join(sorted(_DTYPES))}, got {dtype!r}")
    return name


def _check_fits(spec: ModelSpec, dtype: str, dev: Any, label: str) -> None:
    elem = _torch().tensor([], dtype=getattr(_torch(), dtype)).element_size()
    need = spec.params_b * 1e9 * elem / GIB
    have = device_memory_gib(dev)
    if need > have:
        raise ConfigError(
            f"--model {label}: its weights need {need:.1f} GiB in {dtype}, the {dev.type} "
            f"device has {have:.1f} GiB"
        )


def spec_for(name: str) -> ModelSpec:
    """``tiny`` or a catalog model's spec."""
    if name == "tiny":
        return tiny_llama_spec(name="tiny")
    from sloserve.costmodel.catalog import model_spec

    return model_spec(name)


def load_model(
    *,
    model_spec: str | None = None,
    model_path: str | Path | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    seed: int = 0,
) -> LoadedModel:
    """The model to execute: ``model_spec`` (random weights) or ``model_path``."""
    if (model_spec is None) == (model_path is None):
        raise ConfigError("give exactly one of --model-spec NAME or --model PATH")
    dev = resolve_device(device)
    dt = _dtype(dtype, dev)
    if model_spec is not None:
        spec = spec_for(model_spec)
        _check_fits(spec, dt, dev, model_spec)
        m = LlamaModel(spec, device=str(dev), dtype=dt, seed=seed)
        return LoadedModel(m, model_spec)
    return _load_checkpoint(Path(str(model_path)), dev, dt)


def _config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise ConfigError(f"--model {path}: no such checkpoint directory")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"--model {path}: no config.json (not a Hugging Face checkpoint)")
    try:
        cfg: dict[str, Any] = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--model {path}: unreadable config.json ({e})") from None
    kind = cfg.get("model_type")
    if kind not in LLAMA_TYPES:
        raise ConfigError(f"--model {path}: model_type {kind!r} is not a Llama-family model")
    if cfg.get("rope_scaling"):
        raise ConfigError(f"--model {path}: rope_scaling {cfg['rope_scaling']!r} is not supported")
    return cfg


def checkpoint_spec(path: Path, cfg: dict[str, Any]) -> ModelSpec:
    """The :class:`ModelSpec` a Llama ``config.json`` describes."""
    try:
        h, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads", heads))
        inter, vocab = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"--model {path}: config.json lacks a usable field {e}") from None
    from sloserve.costmodel.profiler.llama import llama_spec

    return llama_spec(
        name=path.name,
        num_layers=layers,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        max_context=int(cfg.get("max_position_embeddings", 4096)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )


def _hf_to_ours(raw: dict[str, Any], spec: ModelSpec, torch: Any) -> dict[str, Any]:
    """Hugging Face Llama tensor names -> :class:`LlamaModel`'s (fused QKV, gate+up)."""
    out: dict[str, Any] = {
        "embed": raw["model.embed_tokens.weight"],
        "final_norm": raw["model.norm.weight"],
    }
    if not spec.tied_embeddings:
        out["lm_head"] = raw.get("lm_head.weight", raw["model.embed_tokens.weight"])
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[f"layers.{i}.w_qkv"] = torch.cat(
            [raw[a + "q_proj.weight"], raw[a + "k_proj.weight"], raw[a + "v_proj.weight"]]
        )
        out[f"layers.{i}.w_o"] = raw[a + "o_proj.weight"]
        out[f"layers.{i}.w_in_norm"] = raw[p + "input_layernorm.weight"]
        out[f"layers.{i}.w_post_norm"] = raw[p + "post_attention_layernorm.weight"]
        out[f"layers.{i}.w_gate_up"] = torch.cat(
            [raw[p + "mlp.gate_proj.weight"], raw[p + "mlp.up_proj.weight"]]
        )
        out[f"layers.{i}.w_down"] = raw[p + "mlp.down_proj.weight"]
    return out


def _load_checkpoint(path: Path, dev: Any, dtype: str) -> LoadedModel:
    cfg = _config(path)
    spec = checkpoint_spec(path, cfg)
    _check_fits(spec, dtype, dev, str(path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--model {path}: no *.safetensors weight files")
    try:
        st = importlib.import_module("safetensors.torch")
    except ImportError:
        raise ConfigError(
            "loading a checkpoint needs safetensors: pip install 'sloserve[execute]'"
        ) from None
    torch = _torch()
    raw: dict[str, Any] = {}
    for f in files:
        raw |= st.load_file(str(f), device="cpu")
    try:
        weights = _hf_to_ours(raw, spec, torch)
    except KeyError as e:
        raise ConfigError(f"--model {path}: weight {e} missing from the checkpoint") from None
    model = LlamaModel(
        spec,
        device=str(dev),
        dtype=dtype,
        weights=weights,
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
    )
    eos = cfg.get("eos_token_id")
    eos_id = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else None
    tok = None
    if (path / "tokenizer.json").is_file():
        try:
            tokenizers = importlib.import_module("tokenizers")
        except ImportError:
            raise ConfigError(
                "a checkpoint tokenizer needs tokenizers: pip install 'sloserve[execute]'"
            ) from None
        tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    template, special = _tokenizer_config(path)
    return LoadedModel(model, path.name, tok, eos_id, template, special)


def _tokenizer_config(path: Path) -> tuple[str | None, dict[str, str]]:
    """The chat template (the ``default`` one of a list) and the BOS/EOS strings of
    ``tokenizer_config.json``; none when the file is absent."""
    f = path / "tokenizer_config.json"
    if not f.is_file():
        return None, {}
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--model {path}: unreadable tokenizer_config.json ({e})") from None
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    special: dict[str, str] = {}
    for key in ("bos_token", "eos_token"):
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            special[key] = v
    return (template if isinstance(template, str) else None), special
