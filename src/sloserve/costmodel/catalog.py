"""The spec catalog: public model shapes and GPU data-sheet facts, looked up by short name.

The data live in ``specs/models.yaml`` and ``specs/gpus.yaml`` (each entry cites its
source: the model's Hugging Face ``config.json``, the GPU's data sheet). Short names are
lower-case (``llama-2-7b``, ``a100-80gb``); lookups are case-insensitive and also accept an
entry's ``aliases`` and, for models, the Hugging Face id (``meta-llama/Llama-2-7b-hf``).
An unknown name raises :class:`~sloserve.core.errors.UnknownNameError` listing the valid
short names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sloserve.core import yamlload
from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.core.hardware import GPUSpec, ModelSpec


@dataclass(frozen=True)
class ModelEntry:
    """One catalog model: its short name, spec and where the numbers come from."""

    key: str
    spec: ModelSpec
    source: str
    aliases: tuple[str, ...] = ()
    notes: str = ""


@dataclass(frozen=True)
class GPUEntry:
    """One catalog GPU: its short name, spec and where the numbers come from."""

    key: str
    spec: GPUSpec
    source: str
    aliases: tuple[str, ...] = ()
    notes: str = ""


def _specs_dir() -> Path:
    return Path(str(resources.files("sloserve.costmodel") / "specs"))


def _read(filename: str, section: str) -> dict[str, dict[str, Any]]:
    path = _specs_dir() / filename
    data = yamlload.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get(section), dict):
        raise ConfigError(f"{path}: expected a mapping under {section!r}")
    out: dict[str, dict[str, Any]] = data[section]
    return out


def _entry_fields(path: str, key: str, raw: dict[str, Any]) -> tuple[str, tuple[str, ...], str]:
    source = raw.get("source")
    if not source:
        raise ConfigError(f"{path}: {key}: every entry must cite its source")
    aliases = tuple(str(a).lower() for a in raw.get("aliases", ()) or ())
    return str(source), aliases, str(raw.get("notes", ""))


@cache
def _models() -> dict[str, ModelEntry]:
    out: dict[str, ModelEntry] = {}
    for key, raw in _read("models.yaml", "models").items():
        source, aliases, notes = _entry_fields("models.yaml", key, raw)
        try:
            spec = ModelSpec.model_validate(raw["spec"])
        except (KeyError, ValidationError) as e:
            raise ConfigError(f"models.yaml: {key}: invalid spec ({e})") from e
        out[key] = ModelEntry(key, spec, source, aliases, notes)
    return out


@cache
def _gpus() -> dict[str, GPUEntry]:
    out: dict[str, GPUEntry] = {}
    for key, raw in _read("gpus.yaml", "gpus").items():
        source, aliases, notes = _entry_fields("gpus.yaml", key, raw)
        try:
            spec = GPUSpec.model_validate(raw["spec"])
        except (KeyError, ValidationError) as e:
            raise ConfigError(f"gpus.yaml: {key}: invalid spec ({e})") from e
        out[key] = GPUEntry(key, spec, source, aliases, notes)
    return out


@cache
def _model_index() -> dict[str, str]:
    idx: dict[str, str] = {}
    for key, e in _models().items():
        for n in (key, *e.aliases, e.spec.name.lower()):
            if idx.setdefault(n, key) != key:
                raise ConfigError(f"models.yaml: name {n!r} is used by two entries")
    return idx


@cache
def _gpu_index() -> dict[str, str]:
    idx: dict[str, str] = {}
    for key, e in _gpus().items():
        for n in (key, *e.aliases, e.spec.name.lower()):
            if idx.setdefault(n, key) != key:
                raise ConfigError(f"gpus.yaml: name {n!r} is used by two entries")
    return idx


def model_names() -> list[str]:
    """Short names of the catalog's models."""
    return list(_models())


def gpu_names() -> list[str]:
    """Short names of the catalog's GPUs."""
    return list(_gpus())


def model_key(name: str) -> str:
    """The canonical short name for a model name, alias or Hugging Face id."""
    key = _model_index().get(name.strip().lower())
    if key is None:
        raise UnknownNameError(f"unknown model {name!r}; valid: {', '.join(model_names())}")
    return key


def gpu_key(name: str) -> str:
    """The canonical short name for a GPU name or alias."""
    key = _gpu_index().get(name.strip().lower())
    if key is None:
        raise UnknownNameError(f"unknown GPU {name!r}; valid: {', '.join(gpu_names())}")
    return key


def model_entry(name: str) -> ModelEntry:
    """The catalog entry (spec, source, aliases) of a model."""
    return _models()[model_key(name)]


def gpu_entry(name: str) -> GPUEntry:
    """The catalog entry (spec, source, aliases) of a GPU."""
    return _gpus()[gpu_key(name)]


def model_spec(name: str) -> ModelSpec:
    """A model's :class:`ModelSpec` by short name (e.g. ``llama-2-7b``)."""
    return model_entry(name).spec


def gpu_spec(name: str) -> GPUSpec:
    """A GPU's :class:`GPUSpec` by short name (e.g. ``a100-80gb``)."""
    return gpu_entry(name).spec


def model_key_for_spec(spec: ModelSpec) -> str | None:
    """The short name of the catalog model whose spec equals ``spec``, if any."""
    for key, e in _models().items():
        if e.spec == spec:
            return key
    return None


def gpu_key_for_spec(spec: GPUSpec) -> str | None:
    """The short name of the catalog GPU whose spec equals ``spec``, if any."""
    for key, e in _gpus().items():
        if e.spec == spec:
            return key
    return None
