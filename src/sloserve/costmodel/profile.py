"""Named replica profiles: a model on a GPU type at a tensor-parallel degree, with fitted
batch-time coefficients. Profiles are data files (``profiles/*.yaml``), not code.

The KV capacity M follows vLLM: ``utilization × memory × tp − weights − activation
reserve``, divided by the KV bytes of one token (KV heads replicated when ``tp`` exceeds
them count once per GPU).

Names :func:`load_profile` accepts
    * a built-in profile name (``llama-2-7b-a100``; :func:`profile_names` lists them; these
      are fitted to measured operator timings by ``scripts/fit_vidur_profiles.py``);
    * ``MODEL@GPU`` or ``MODEL@GPUxTP`` with catalog short names or aliases
      (``llama-3-8b@h100-80gb``, ``llama-2-70b@a100-80gbx2``; see
      :mod:`sloserve.costmodel.catalog`). When a built-in profile has that model, GPU and
      TP, the built-in (calibrated) profile is returned: calibrated data take precedence.
      Otherwise the profile is built from the specs by :func:`profile_from_specs`;
    * ``roofline:MODEL@GPU[xTP]`` always builds from the specs (to compare with the
      calibrated profile);
    * a path to a profile YAML file.

Profiles from specs (:func:`profile_from_specs`)
    The roofline model (:mod:`sloserve.costmodel.roofline`) with its documented default
    efficiencies, **linearised** into :class:`LinearCoefficients` (choice: every consumer of
    a profile — the engine, the policies' estimates, the fast path's vectorised runs —
    keeps working with one linear model and one code path; the linearisation's error
    against the roofline is in the profile's ``fit_report``). The roofline model itself is
    available as :meth:`ReplicaProfile.roofline`.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import Field, ValidationError

from sloserve.core import yamlload
from sloserve.core.errors import (
    ConfigError,
    UnknownNameError,
    did_you_mean,
    plain_message,
    yaml_problem,
)
from sloserve.core.hardware import GPUSpec, ModelSpec, SpecModel
from sloserve.costmodel.base import CostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel

if TYPE_CHECKING:
    from sloserve.costmodel.roofline import RooflineCostModel, RooflineParams

GIB = 1024**3

DEFAULT_ACTIVATION_RESERVE_GIB = 1.0
"""Per-GPU memory kept for activations (vLLM profiles a forward pass; ~1 GiB for 7B-70B)."""

SPEC_NAME = re.compile(r"^(?P<model>[^@\s]+)@(?P<gpu>[^@\s]+)$")
"""``MODEL@GPU`` or ``MODEL@GPUxTP``."""
TP_SUFFIX = re.compile(r"^(?P<gpu>.+)x(?P<tp>\d+)$")

ROOFLINE_PREFIX = "roofline:"


def kv_capacity(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    utilization: float = 0.9,
    activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB,
) -> int:
    """KV tokens that fit beside the weights on ``tp`` GPUs; negative if the weights do not
    fit (no error: callers searching for a TP use the sign)."""
    if not 0 < utilization <= 1:
        raise ConfigError(f"kv utilization must be in (0, 1], got {utilization}")
    free = (
        utilization * gpu.memory_gib * GIB * tp
        - model.weight_bytes
        - activation_reserve_gib * GIB * tp
    )
    if free <= 0:
        return -1
    return int(free // model.kv_bytes_per_token_tp(tp))


class ReplicaProfile(SpecModel):
    """One serving replica's hardware and its calibrated linear batch-time model."""

    name: str
    description: str = ""
    model: ModelSpec
    gpu: GPUSpec
    tp: int = Field(default=1, ge=1, description="tensor-parallel degree (GPUs per replica)")
    activation_reserve_gib: float = Field(
        default=DEFAULT_ACTIVATION_RESERVE_GIB,
        ge=0,
        description="per-GPU memory kept for activations, not KV",
    )
    coefficients: LinearCoefficients
    source: str = Field(description="where the coefficients come from")
    fit_report: dict[str, Any] = Field(default_factory=dict)
    gpu_hour_usd: float | None = Field(
        default=None,
        ge=0,
        le=1e4,
        allow_inf_nan=False,
        description="price of one GPU-hour of this GPU kind (cost per million tokens in "
        "`sloserve capacity`); unset: no cost is reported",
    )

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over the whole replica (replicated KV heads included)."""
        return self.model.kv_bytes_per_token_tp(self.tp)

    def kv_capacity_tokens(self, utilization: float = 0.9) -> int:
        """M: how many tokens of KV fit on the replica's GPUs at this memory utilisation."""
        m = kv_capacity(self.model, self.gpu, self.tp, utilization, self.activation_reserve_gib)
        if m <= 0:
            raise ConfigError(
                f"profile {self.name}: model weights do not fit at utilization {utilization}"
            )
        return m

    def cost_model(self) -> LinearCostModel:
        """The profile's linear batch-time model; swaps go over every GPU's PCIe link."""
        return LinearCostModel(
            self.coefficients,
            kv_bytes_per_token=self.kv_bytes_per_token,
            swap_bytes_per_s=self.gpu.pcie_gb_per_s * 1e9 * self.tp,
            name=self.name,
        )

    def roofline(self, params: RooflineParams | None = None) -> RooflineCostModel:
        """The roofline model of this profile's model, GPU and TP (needs the GPU's peak
        FLOP/s and bandwidth)."""
        from sloserve.costmodel.roofline import DEFAULT_PARAMS, RooflineCostModel

        try:
            return RooflineCostModel(
                self.model,
                self.gpu,
                self.tp,
                params or DEFAULT_PARAMS,
                name=f"roofline:{self.name}",
            )
        except ValueError as e:
            raise ConfigError(f"profile {self.name}: no roofline model ({e})") from e


def single_request_decode_latency(profile: ReplicaProfile | CostModel, context: int) -> float:
    """Seconds of one decode step of a single request reading ``context`` KV tokens.

    Aladdin sets decode (TPOT) SLOs as a multiple (1.3×) of this latency.
    """
    if context < 0:
        raise ValueError("context must be >= 0")
    cm = profile.cost_model() if isinstance(profile, ReplicaProfile) else profile
    return cm.decode_time(1, context)


def _profile_dir() -> Path:
    return Path(str(resources.files("sloserve.costmodel") / "profiles"))


@cache
def _builtin_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(_profile_dir().glob("*.yaml"))}


def profile_names() -> list[str]:
    """Names of the built-in profiles."""
    return list(_builtin_files())


@cache
def _builtin_by_hardware() -> dict[tuple[str, str, int], str]:
    """(model name, GPU name, TP) → built-in profile name."""
    out: dict[tuple[str, str, int], str] = {}
    for name, path in _builtin_files().items():
        p = load_profile_file(path)
        out.setdefault((p.model.name, p.gpu.name, p.tp), name)
    return out


def load_profile_file(path: str | Path) -> ReplicaProfile:
    """Read a profile YAML; errors name the file and the bad field."""
    p = Path(path)
    try:
        data = yamlload.safe_load(p.read_text())
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
        raise ConfigError(f"{p}: field {loc}: {plain_message(err)}") from e


def _smallest_fitting_tp(model: ModelSpec, gpu: GPUSpec) -> int | None:
    for tp in (1, 2, 4, 8, 16):
        if model.num_heads % tp == 0 and kv_capacity(model, gpu, tp, 1.0) > 0:
            return tp
    return None


def profile_from_specs(
    model: str | ModelSpec,
    gpu: str | GPUSpec,
    tp: int = 1,
    params: RooflineParams | None = None,
    *,
    activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB,
    max_tokens: int = 8192,
    name: str | None = None,
) -> ReplicaProfile:
    """A profile for any model on any GPU at TP ``tp``, from the roofline model.

    ``model``/``gpu`` are catalog names (or specs). The roofline with ``params`` (default:
    the documented defaults) is linearised over 1..``max_tokens`` tokens
    (:func:`sloserve.costmodel.roofline.linear_coefficients`). Raises
    :class:`ConfigError` when the weights do not fit on ``tp`` GPUs (naming the smallest TP
    that fits) or when the GPU lacks peak FLOP/s or bandwidth.
    """
    from sloserve.costmodel import catalog
    from sloserve.costmodel.roofline import DEFAULT_PARAMS, RooflineCostModel, linear_coefficients

    if isinstance(model, str):
        mkey: str | None = catalog.model_key(model)
        mentry = catalog.model_entry(model)
        mspec, msource = mentry.spec, mentry.source
    else:
        mkey, mspec, msource = catalog.model_key_for_spec(model), model, "given ModelSpec"
    if isinstance(gpu, str):
        gkey: str | None = catalog.gpu_key(gpu)
        gentry = catalog.gpu_entry(gpu)
        gspec, gsource = gentry.spec, gentry.source
    else:
        gkey, gspec, gsource = catalog.gpu_key_for_spec(gpu), gpu, "given GPUSpec"
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")
    label = f"{mkey or mspec.name}@{gkey or gspec.name}" + (f"x{tp}" if tp > 1 else "")
    if mspec.num_heads % tp:
        raise ConfigError(f"{label}: {mspec.num_heads} attention heads do not split over TP {tp}")
    if kv_capacity(mspec, gspec, tp, 1.0, activation_reserve_gib) <= 0:
        best = _smallest_fitting_tp(mspec, gspec)
        hint = f"; smallest TP that fits: {best}" if best else ""
        raise ConfigError(
            f"{label}: {mspec.weight_bytes / GIB:.1f} GiB of weights do not fit on {tp}× "
            f"{gspec.name} ({gspec.memory_gib:g} GiB){hint}"
        )
    p = params or DEFAULT_PARAMS
    try:
        rm = RooflineCostModel(mspec, gspec, tp, p)
    except ValueError as e:
        raise ConfigError(f"{label}: {e}") from e
    lin = linear_coefficients(rm, max_tokens)
    return ReplicaProfile(
        name=name or label,
        description=f"{mspec.name} on {tp}× {gspec.name}, roofline from public specs",
        model=mspec,
        gpu=gspec,
        tp=tp,
        activation_reserve_gib=activation_reserve_gib,
        coefficients=lin.coefficients,
        source=(
            "Roofline model (sloserve.costmodel.roofline) from public specs, linearised; not "
            f"calibrated to measurements. Model: {msource}. GPU: {gsource}."
        ),
        fit_report={
            "kind": "roofline",
            "roofline_params": p.model_dump(mode="json"),
            "linearisation": lin.report(),
        },
    )


def parse_spec_name(name: str) -> tuple[str, str, int] | None:
    """``(model, gpu, tp)`` catalog keys of a ``MODEL@GPU[xTP]`` name, or None if the name
    does not have that form. Raises :class:`UnknownNameError` for an unknown model or GPU."""
    from sloserve.costmodel import catalog

    m = SPEC_NAME.match(name.strip())
    if m is None:
        return None
    model, gpu = m["model"], m["gpu"]
    with_tp = TP_SUFFIX.match(gpu)
    try:
        gkey, tp = catalog.gpu_key(gpu), 1
    except UnknownNameError:
        if with_tp is None:
            raise
        gkey, tp = catalog.gpu_key(with_tp["gpu"]), int(with_tp["tp"])
    if tp < 1:
        raise ConfigError(f"profile name {name!r}: TP must be >= 1")
    return catalog.model_key(model), gkey, tp


def load_profile(name_or_path: str) -> ReplicaProfile:
    """A built-in profile by name, a ``MODEL@GPU[xTP]`` spec name, or a profile YAML path
    (see the module docstring for the syntax and the precedence)."""
    files = _builtin_files()
    if name_or_path in files:
        return load_profile_file(files[name_or_path])
    forced = name_or_path.startswith(ROOFLINE_PREFIX)
    spec_name = name_or_path[len(ROOFLINE_PREFIX) :] if forced else name_or_path
    if "@" in spec_name:
        parsed = parse_spec_name(spec_name)
        if parsed is None:
            raise UnknownNameError(
                f"malformed profile name {name_or_path!r}: expected MODEL@GPU or MODEL@GPUxTP "
                "(e.g. llama-3-8b@h100-80gb, llama-2-70b@a100-80gbx2)"
            )
        from sloserve.costmodel import catalog

        mkey, gkey, tp = parsed
        if not forced:
            hw = (catalog.model_spec(mkey).name, catalog.gpu_spec(gkey).name, tp)
            builtin = _builtin_by_hardware().get(hw)
            if builtin is not None:
                return load_profile_file(files[builtin])
        return profile_from_specs(mkey, gkey, tp)
    if name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).is_file():
        return load_profile_file(name_or_path)
    raise UnknownNameError(
        f"unknown profile {name_or_path!r}{did_you_mean(name_or_path, profile_names())}; "
        f"valid: {', '.join(profile_names()) or '(none)'}; "
        "or MODEL@GPU[xTP] with models and GPUs from the catalog (sloserve.costmodel.catalog)"
    )
