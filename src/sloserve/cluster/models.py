"""The cluster's model registry: what each model weighs, and what loading it costs.

A replica serves one model at a time. Changing it (a scheduled ``model_swaps`` entry, or a
controller's :class:`~sloserve.cluster.controller.ChangeModel`) and a replica's cold start
both cost :func:`~sloserve.costmodel.transfer.weights_load_time` of the model's weights
from a storage tier; the replica serves nothing while it loads (``LOADING``).

Where the numbers come from (choices, written down):

- A model's weights and KV bytes per token come from the spec catalog
  (``costmodel/specs/models.yaml``) or the profile that serves it; ``cluster.models``
  overrides them per model (``weights_gib``, ``kv_bytes_per_token``). A model found in
  neither must be given ``weights_gib``.
- The tier: a model this replica has served before loads from ``cpu`` (its weights stayed
  in host memory: QLM's warm start); any other from the model's ``tier`` (default
  ``disk``). A controller that reads models into host memory ahead of time (QLM's
  prefetch; ``lifecycle.ReadsIntoCPU``) may shorten a load that starts while that read is
  under way to the rest of the read plus the copy from host memory, tier ``read``
  (the cold load when that is quicker).
- Bandwidths (:class:`TransferConfig`, ``cluster.transfer``): disk 2 GB/s (an NVMe read
  through the page cache; see ``costmodel/transfer.py``), host-to-GPU the GPU spec's
  effective PCIe rate (25 GB/s for Gen4) per GPU, so × TP for a tensor-parallel replica;
  ``init_s`` 0. Example: Llama-2-7B (13.5 GB) on one A100: 6.7 s from disk, 0.54 s warm.
- The profile a replica uses once it serves a model: the model's ``profile`` if set, else
  the profile of the first replica group configured with that model, else the roofline
  profile of the model on the replica's GPU and TP (``MODEL@GPUxTP``).
- A replica's model name is the catalog's short name of its profile's model
  (``llama-2-7b``), or the profile's model name when the catalog lacks it, unless the group
  sets ``model``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sloserve.core.bounds import MAX_BANDWIDTH, Time
from sloserve.core.errors import ConfigError, UnknownNameError
from sloserve.costmodel.catalog import gpu_key_for_spec, model_key_for_spec, model_spec
from sloserve.costmodel.profile import ReplicaProfile, load_profile
from sloserve.costmodel.transfer import DEFAULT_DISK_GB_PER_S, weights_load_time

GIB = float(1 << 30)


class ModelOverride(BaseModel):
    """``cluster.models.<name>``: what the catalog does not know, or should not say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_gib: float | None = Field(default=None, gt=0, description="checkpoint size, GiB")
    kv_bytes_per_token: int | None = Field(
        default=None, gt=0, description="KV bytes per token (whole model, all GPUs)"
    )
    profile: str | None = Field(
        default=None, description="the profile of a replica serving this model"
    )
    tier: Literal["disk", "cpu", "gpu"] = Field(
        default="disk", description="where the weights are when a replica first loads them"
    )


class TransferConfig(BaseModel):
    """``cluster.transfer``: bandwidths of model loads and of KV moves between replicas."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    disk_gb_per_s: float = Field(
        default=DEFAULT_DISK_GB_PER_S,
        gt=0,
        le=MAX_BANDWIDTH,
        allow_inf_nan=False,
        description="checkpoint read rate, GB/s",
    )
    pcie_gb_per_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BANDWIDTH,
        allow_inf_nan=False,
        description="host-to-GPU rate per GPU, GB/s; unset: the GPU spec's",
    )
    init_s: Time = Field(default=0.0, description="fixed start-up added to every load")
    kv_link_gb_per_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BANDWIDTH,
        allow_inf_nan=False,
        description="prefill-to-decode KV link per GPU, GB/s (disaggregated serving); unset: "
        "the prefill GPU's measured NVLink rate (A100 224, H100 340.8, A40 4.0), else PCIe",
    )
    kv_link_latency_s: Time = Field(default=0.0, description="per KV transfer")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model as the cluster knows it."""

    name: str
    weight_bytes: float
    kv_bytes_per_token: int
    profile: str | None
    tier: str


def model_name_of(profile: ReplicaProfile) -> str:
    """The routing key of a profile's model: its catalog short name, else its own name."""
    return model_key_for_spec(profile.model) or profile.model.name


class ModelRegistry:
    """Models by name: the catalog's, the configured replicas', and ``cluster.models``."""

    def __init__(
        self,
        overrides: Mapping[str, ModelOverride],
        replica_profiles: Mapping[str, str],
        transfer: TransferConfig,
        load: Callable[[str], ReplicaProfile] = load_profile,
    ) -> None:
        """``replica_profiles``: model name -> the profile of the first group serving it;
        ``load`` reads a profile (a run passes its own cached reader)."""
        self.transfer = transfer
        self._load = load
        self._info: dict[str, ModelInfo] = {}
        names = list(dict.fromkeys([*replica_profiles, *overrides]))
        for name in names:
            self._info[name] = self._build(name, overrides.get(name), replica_profiles.get(name))

    def _build(self, name: str, over: ModelOverride | None, profile: str | None) -> ModelInfo:
        over = over or ModelOverride()
        prof_name = over.profile or profile
        spec = None
        if prof_name is not None:
            try:
                spec = self._load(prof_name).model
            except ConfigError as e:
                raise ConfigError(f"cluster.models.{name}.profile: {e}") from None
        else:
            try:
                spec = model_spec(name)
            except UnknownNameError:
                spec = None
        if spec is None and (over.weights_gib is None or over.kv_bytes_per_token is None):
            raise ConfigError(
                f"cluster.models.{name}: not in the model catalog and no replica serves it; "
                "give weights_gib, kv_bytes_per_token and profile"
            )
        weights = over.weights_gib * GIB if over.weights_gib is not None else None
        kv = over.kv_bytes_per_token
        return ModelInfo(
            name,
            weights if weights is not None else spec.weight_bytes,  # type: ignore[union-attr]
            kv if kv is not None else spec.kv_bytes_per_token,  # type: ignore[union-attr]
            prof_name,
            over.tier,
        )

    def __contains__(self, name: object) -> bool:
        return name in self._info

    def names(self) -> list[str]:
        return sorted(self._info)

    def get(self, name: str) -> ModelInfo:
        """The model, or a ConfigError naming the known ones."""
        info = self._info.get(name)
        if info is None:
            try:
                info = self._build(name, None, None)
            except ConfigError:
                raise ConfigError(
                    f"unknown model {name!r}; known: {', '.join(self.names())}"
                ) from None
            self._info[name] = info
        return info

    def profile_for(self, name: str, current: ReplicaProfile) -> str:
        """The profile a replica now running ``current`` uses once it serves ``name``."""
        info = self.get(name)
        if info.profile is not None:
            return info.profile
        gpu = gpu_key_for_spec(current.gpu)
        if gpu is None:
            raise ConfigError(
                f"cluster.models.{name}.profile: needed (replica GPU {current.gpu.name!r} "
                "is not in the catalog)"
            )
        return f"{name}@{gpu}x{current.tp}"

    def load_time(self, name: str, profile: ReplicaProfile, tier: str) -> float:
        """Seconds for a replica of ``profile``'s hardware to load ``name`` from ``tier``."""
        info = self.get(name)
        t = self.transfer
        pcie = t.pcie_gb_per_s if t.pcie_gb_per_s is not None else profile.gpu.pcie_gb_per_s
        return weights_load_time(
            info.weight_bytes,
            tier,
            tp=profile.tp,
            disk_gb_per_s=t.disk_gb_per_s,
            pcie_gb_per_s=pcie,
            init_s=t.init_s,
        )
