"""Loading run configs from YAML plus command-line overrides, with one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sloserve.core.errors import ConfigError, yaml_problem


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
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
    shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    return f"{err['msg']}{shown}"


def validate(model: type[BaseModel], data: Mapping[str, Any], source: str) -> Any:
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise ConfigError(validation_message(e, source)) from None
