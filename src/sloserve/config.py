"""Loading run configs from YAML plus command-line overrides, with one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sloserve.core import yamlload
from sloserve.core.errors import ConfigError, plain_message, yaml_problem


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = yamlload.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config ({e.strerror})") from e
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text (UTF-8) file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({yaml_problem(e)})") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the config must be a mapping of keys, not {type(data).__name__}")
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, mapping by mapping (a YAML section refines, not replaces)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def builtin_config(name: str) -> dict[str, Any]:
    return read_yaml(Path(str(resources.files("sloserve") / "configs" / f"{name}.yaml")))


def set_path(d: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """``d[a][b][c] = value``, creating the mappings on the way."""
    for k in path[:-1]:
        nxt = d.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            d[k] = nxt
        d = nxt
    d[path[-1]] = value


def validation_message(e: ValidationError, source: str) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"] if not isinstance(x, int) or True)
    if err["type"] == "extra_forbidden":
        return f"{source}: unknown key {loc!r}"
    return f"{source}: {loc}: {error_text(err)}"


def error_text(err: Any) -> str:
    """One pydantic error as text: the message and the value given (a validator's own
    message already names its value)."""
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or err["type"] == "missing" else f" (got {got!r})"
    return f"{plain_message(err)}{shown}"


def validate(model: type[BaseModel], data: Mapping[str, Any], source: str) -> Any:
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise ConfigError(validation_message(e, source)) from None


# vLLM's engine-argument and `vllm bench serve` names that mean exactly one sloserve key.
# Accepted in YAML under `engine:` (engine arguments) or beside the native key, and as flags.
VLLM_INSTANCE_ALIASES: dict[str, str] = {
    "max_num_seqs": "max_running",
    "max_num_batched_tokens": "max_batch_tokens",
    "gpu_memory_utilization": "kv_utilization",
    "long_prefill_token_threshold": "chunk_size",
    "enable_prefix_caching": "prefix_caching",
}
VLLM_WORKLOAD_ALIASES: dict[str, str] = {
    "request_rate": "rate",
    "num_prompts": "num_requests",
}
# vLLM names that need a computation (cli/_vllm.py resolves them once every value is known).
VLLM_INSTANCE_DERIVED = (
    "num_gpu_blocks_override",
    "tensor_parallel_size",
    "enable_chunked_prefill",
)


def _rename(section: dict[str, Any], old: str, new: str, where: str) -> None:
    if old not in section:
        return
    value = section.pop(old)
    if new in section and section[new] != value:
        raise ConfigError(
            f"{where}: {old} ({value!r}) contradicts {new} ({section[new]!r}); give one of them"
        )
    section[new] = value


def apply_vllm_names(data: dict[str, Any], source: str) -> dict[str, Any]:
    """``data`` with vLLM's key names turned into sloserve's: an ``engine:`` section (vLLM
    engine arguments, dashes or underscores) joins ``instance:``; vLLM names inside
    ``instance:`` and ``workload:`` become the native keys; ``request_rate`` is the arrival
    rate. A vLLM name and its native key with different values is an error."""
    out = dict(data)
    instance = dict(out.get("instance") or {})
    engine = out.pop("engine", None)
    if engine is not None:
        if not isinstance(engine, Mapping):
            raise ConfigError(f"{source}: 'engine' must be a mapping of vLLM engine arguments")
        for k, v in engine.items():
            key = str(k).replace("-", "_")
            native = VLLM_INSTANCE_ALIASES.get(key, key)
            if native in instance and instance[native] != v:
                raise ConfigError(
                    f"{source}: engine.{k} ({v!r}) contradicts instance.{native} "
                    f"({instance[native]!r}); give one of them"
                )
            instance[native] = v
    for old, new in VLLM_INSTANCE_ALIASES.items():
        _rename(instance, old, new, f"{source}: instance")
    if instance or "instance" in out:
        out["instance"] = instance
    workload = out.get("workload")
    if isinstance(workload, Mapping):
        workload = dict(workload)
        if "num_prompts" in workload:
            _rename(workload, "num_prompts", "num_requests", f"{source}: workload")
        if "request_rate" in workload:
            arrival = dict(workload.get("arrival") or {})
            arrival_src = {"rate": arrival["rate"]} if "rate" in arrival else {}
            arrival_src["request_rate"] = workload.pop("request_rate")
            _rename(arrival_src, "request_rate", "rate", f"{source}: workload.arrival")
            arrival["rate"] = arrival_src["rate"]
            workload["arrival"] = arrival
        out["workload"] = workload
    return out
