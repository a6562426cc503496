"""Named replica profiles: a model on a GPU type at a tensor-parallel degree, with fitted
batch-time coefficients. Profiles are data files (``profiles/*.yaml``), not code.

The KV capacity M follows vLLM: ``utilization × memory × tp − weights − activation
reserve``, divided by the KV bytes of one token.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sloserve.core.errors import ConfigError, UnknownNameError, yaml_problem
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel

GIB = 1024**3


class ReplicaProfile(BaseModel):
    """One serving replica's hardware and its calibrated linear batch-time model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    model: ModelSpec
    gpu: GPUSpec
    tp: int = Field(default=1, ge=1, description="tensor-parallel degree (GPUs per replica)")
    activation_reserve_gib: float = Field(
        default=1.0, ge=0, description="per-GPU memory kept for activations, not KV"
    )
    coefficients: LinearCoefficients
    source: str = Field(description="where the coefficients come from")
    fit_report: dict[str, Any] = Field(default_factory=dict)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    def kv_capacity_tokens(self, utilization: float = 0.9) -> int:
        """M: how many tokens of KV fit on the replica's GPUs at this memory utilisation."""
        if not 0 < utilization <= 1:
            raise ConfigError(f"kv utilization must be in (0, 1], got {utilization}")
        free = (
            utilization * self.gpu.memory_gib * GIB * self.tp
            - self.model.weight_bytes
            - self.activation_reserve_gib * GIB * self.tp
        )
        if free <= 0:
            raise ConfigError(
                f"profile {self.name}: model weights do not fit at utilization {utilization}"
            )
        return int(free // self.kv_bytes_per_token)

    def cost_model(self) -> LinearCostModel:
        return LinearCostModel(
            self.coefficients,
            kv_bytes_per_token=self.kv_bytes_per_token,
            swap_bytes_per_s=self.gpu.pcie_gb_per_s * 1e9 * self.tp,
            name=self.name,
        )


def _profile_dir() -> Path:
    return Path(str(resources.files("sloserve.costmodel") / "profiles"))


@cache
def _builtin_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(_profile_dir().glob("*.yaml"))}


def profile_names() -> list[str]:
    """Names of the built-in profiles."""
    return list(_builtin_files())


def load_profile_file(path: str | Path) -> ReplicaProfile:
    """Read a profile YAML; errors name the file and the bad field."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"{p}: cannot read profile ({e.strerror})") from e
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text (UTF-8) file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({yaml_problem(e)})") from e
    try:
        return ReplicaProfile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{p}: field {loc}: {err['msg']}") from e


def load_profile(name_or_path: str) -> ReplicaProfile:
    """A built-in profile by name, or a profile YAML by path."""
    files = _builtin_files()
    if name_or_path in files:
        return load_profile_file(files[name_or_path])
    if name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).is_file():
        return load_profile_file(name_or_path)
    raise UnknownNameError(
        f"unknown profile {name_or_path!r}; valid: {', '.join(profile_names()) or '(none)'}"
    )
