"""Turning fitted coefficients into a :class:`ReplicaProfile` and its YAML file.

The hardware a measured table describes comes from its metadata columns
(:mod:`.profile_csv`), a base profile, or the caller; :func:`profile_from_csv` is
``sloserve costmodel fit``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sloserve.core.errors import ConfigError, plain_message
from sloserve.core.hardware import GPUSpec, ModelSpec
from sloserve.costmodel.fit.lstsq import _clean
from sloserve.costmodel.fit.profile_csv import (
    DEVICE_COLUMN_PREFIX,
    MODEL_COLUMN_PREFIX,
    read_profile_csv,
)
from sloserve.costmodel.fit.profile_fit import fit_profile_table
from sloserve.costmodel.linear import LinearCoefficients
from sloserve.costmodel.profile import ReplicaProfile, load_profile

ACTIVATION_RESERVE_GIB = 1.0
"""Per-GPU memory kept for activations (the :class:`ReplicaProfile` default)."""


# --------------------------------------------------------------------------- fitted profiles

PROFILE_YAML_HEADER = (
    "# Fitted by sloserve (sloserve.costmodel.fit.fit_profile_csv) from measured iterations.\n"
    "# Refit rather than edit: sloserve costmodel fit PROFILE.csv --out THIS.yaml\n"
)


def _metadata_spec(
    cls: Callable[..., Any],
    fields: Mapping[str, Any],
    prefix: str,
    name: Any,
    metadata: Mapping[str, Any],
    source: str,
) -> Any:
    given = {f: metadata[prefix + f] for f in fields if f != "name" and prefix + f in metadata}
    required = [f for f, info in fields.items() if f != "name" and info.is_required()]
    if name is None or any(f not in given for f in required):
        return None
    try:
        return cls(name=str(name), **given)
    except ValidationError as e:
        err = e.errors()[0]
        col = "model" if err["loc"] == ("name",) else prefix + ".".join(map(str, err["loc"]))
        raise ConfigError(f"{source}: column {col}: {plain_message(err)}") from e


def hardware_from_metadata(
    metadata: Mapping[str, Any], source: str = "<metadata>"
) -> tuple[ModelSpec | None, GPUSpec | None, int | None]:
    """(model, GPU, tp) described by a table's metadata columns; None where incomplete.

    A model needs ``model`` and every required ``model_<field>``; a GPU needs ``device`` and
    ``device_memory_gib``.
    """
    model = _metadata_spec(
        ModelSpec,
        ModelSpec.model_fields,
        MODEL_COLUMN_PREFIX,
        metadata.get("model"),
        metadata,
        source,
    )
    gpu = _metadata_spec(
        GPUSpec,
        GPUSpec.model_fields,
        DEVICE_COLUMN_PREFIX,
        metadata.get("device"),
        metadata,
        source,
    )
    tp: int | None = None
    if "tp" in metadata:
        try:
            tp = int(float(metadata["tp"]))
        except ValueError:
            raise ConfigError(f"{source}: column tp: not an integer ({metadata['tp']!r})") from None
    return model, gpu, tp


def profile_from_coefficients(
    coefficients: LinearCoefficients,
    *,
    name: str,
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int = 1,
    source: str,
    description: str = "",
    fit_report: Mapping[str, Any] | None = None,
    activation_reserve_gib: float = ACTIVATION_RESERVE_GIB,
) -> ReplicaProfile:
    """A :class:`ReplicaProfile` from fitted coefficients and the hardware they describe."""
    try:
        return ReplicaProfile(
            name=name,
            description=description,
            model=model,
            gpu=gpu,
            tp=tp,
            activation_reserve_gib=activation_reserve_gib,
            coefficients=coefficients,
            source=source,
            fit_report=dict(_clean(dict(fit_report or {}))),
        )
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"profile {name}: field {loc}: {plain_message(err)}") from e


def profile_from_csv(
    path: str | Path,
    *,
    name: str | None = None,
    model: ModelSpec | None = None,
    gpu: GPUSpec | None = None,
    tp: int | None = None,
    base_profile: str | None = None,
    description: str = "",
) -> ReplicaProfile:
    """Fit a measured-iteration CSV and assemble a profile (``sloserve costmodel fit``).

    The model, GPU and TP degree come from, in order: the arguments, ``base_profile`` (a
    built-in profile name or YAML path whose hardware the measurements describe), the CSV's
    metadata columns. ``name`` defaults to the CSV's file stem.
    """
    p = Path(path)
    table = read_profile_csv(p)
    coefficients, report = fit_profile_table(table)
    base = load_profile(base_profile) if base_profile else None
    meta_model, meta_gpu, meta_tp = hardware_from_metadata(table.metadata, str(p))
    model = model or (base.model if base else None) or meta_model
    gpu = gpu or (base.gpu if base else None) or meta_gpu
    if model is None or gpu is None:
        what = "model shape (model and model_* columns)" if model is None else "device"
        raise ConfigError(
            f"{p}: no {what} in the CSV; pass a base profile (its model and GPU are used) "
            "or a ModelSpec and GPUSpec"
        )
    tp = tp or (base.tp if base else None) or meta_tp or 1
    reserve = base.activation_reserve_gib if base else ACTIVATION_RESERVE_GIB
    setting = ", ".join(
        f"{k} {v}" for k, v in report["metadata"].items() if k in ("device", "dtype")
    )
    total = report["total"]
    err = total.get("median_rel_err")
    source = (
        f"Fitted by sloserve.costmodel.fit.fit_profile_csv to {p.name}: {report['points']} "
        f"distinct measured iterations ({setting or 'setting not recorded'}), "
        f"{report['mode']} fit"
        + (f", held-out median relative error {err:.1%}" if err is not None else "")
        + (f"; model and GPU from profile {base.name}" if base else "")
        + "."
    )
    return profile_from_coefficients(
        coefficients,
        name=name or p.stem,
        model=model,
        gpu=gpu,
        tp=tp,
        source=source,
        description=description or f"{model.name} on {gpu.name}, TP{tp}, measured",
        fit_report=report,
        activation_reserve_gib=reserve,
    )


def render_profile_yaml(profile: ReplicaProfile, header: str = PROFILE_YAML_HEADER) -> str:
    """The YAML text of a profile, fields in schema order (as the built-in files)."""
    data: dict[str, Any] = profile.model_dump(mode="json")
    if data.get("gpu_hour_usd") is None:  # no price: the file stays as it was
        data.pop("gpu_hour_usd", None)
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def write_profile_yaml(
    profile: ReplicaProfile, path: str | Path, header: str = PROFILE_YAML_HEADER
) -> Path:
    """Write a profile YAML that ``load_profile(path)`` / ``--profile path`` reads back."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(render_profile_yaml(profile, header), encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot write profile ({e.strerror})") from e
    return p
