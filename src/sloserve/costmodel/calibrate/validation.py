"""The uncalibrated roofline against every one of Vidur's measurements.

Roofline validation (:func:`validate_roofline`)
    The uncalibrated roofline (default :class:`RooflineParams`) against every measurement:
    non-attention per model/GPU/TP (every TP in every ``mlp.csv``, without the LM head,
    which Vidur does not time), decode and prefill attention (70B TP2 A100), and all-reduce
    per topology and worker count, grouped by the link the ring crosses: ``nvlink`` (one
    NVLink domain: a pair on ``*_pairwise_nvlink``, a whole ``*_dgx`` node), ``pcie``
    (``*_pairwise_nvlink`` with 4 workers) and ``cross_node`` (``*_dgx`` with fewer devices
    per node than workers; the roofline stands the GPU's PCIe rate in for the network —
    sloserve's replicas are single-node, so this group is reported, not relied on). The A100
    rows are compared with the A100-80GB SXM spec although Vidur's A100 nodes may be PCIe
    cards (5% less bandwidth).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.costmodel import catalog
from sloserve.costmodel.calibrate.pairs import (
    REFERENCE_GPU,
    REFERENCE_MODEL,
    REFERENCE_TP,
    VIDUR_GPUS,
    VidurPair,
    _attention_tables,
    _read_csv,
    _sig,
    all_reduce_topology,
    load_all_reduce_rows,
    load_mlp,
    vidur_pairs,
)
from sloserve.costmodel.fit.vidur_tables import ATTENTION_70B_TP2_CSV, MS
from sloserve.costmodel.roofline import DEFAULT_PARAMS, RooflineCostModel, RooflineParams


@dataclass(frozen=True)
class ValidationRow:
    """The roofline's error on one set of measurements."""

    group: str
    config: str
    n: int
    median_rel_err: float
    p90_rel_err: float
    signed_median: float
    """Median of (pred − measured)/measured: > 0 means the roofline is slow."""
    rel_errors: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The row's numbers (without the per-point errors), rounded, for reports."""
        return {
            "n": self.n,
            "median_rel_err": _sig(self.median_rel_err, 4),
            "p90_rel_err": _sig(self.p90_rel_err, 4),
            "signed_median": _sig(self.signed_median, 4),
        }


def _row(group: str, config: str, pred: Any, meas: Any) -> ValidationRow:
    p = np.asarray(pred, dtype=np.float64)
    m = np.asarray(meas, dtype=np.float64)
    signed = (p - m) / m
    rel = np.abs(signed)
    return ValidationRow(
        group=group,
        config=config,
        n=int(m.size),
        median_rel_err=float(np.median(rel)),
        p90_rel_err=float(np.quantile(rel, 0.9)),
        signed_median=float(np.median(signed)),
        rel_errors=tuple(float(x) for x in rel),
    )


def _config(model_key: str, gpu_dir: str, tp: int) -> str:
    return f"{model_key} {gpu_dir} tp{tp}"


def validate_roofline(
    vidur_dir: str | Path, params: RooflineParams = DEFAULT_PARAMS
) -> list[ValidationRow]:
    """The roofline (``params``) against every Vidur measurement, one row per configuration
    (see the module docstring for the groups)."""
    root = Path(vidur_dir)
    p_na = params.model_copy(update={"include_lm_head": False})
    rows: list[ValidationRow] = []
    for pair in vidur_pairs(root):
        for tp in pair.tps:
            if pair.model.num_heads % tp:
                continue
            table = load_mlp(root / pair.mlp_rel, tp, pair.model.num_layers)
            rm = RooflineCostModel(pair.model, pair.gpu, tp, p_na)
            pred = rm.non_attention_time(table["num_tokens"].to_numpy())
            meas = table["iteration_ms"].to_numpy() * MS
            rows.append(
                _row("non_attention", _config(pair.model_key, pair.gpu_dir, tp), pred, meas)
            )

    ref = RooflineCostModel(
        catalog.model_spec(REFERENCE_MODEL),
        catalog.gpu_spec(VIDUR_GPUS[REFERENCE_GPU]),
        REFERENCE_TP,
        p_na,
    )
    decode, prefill = _attention_tables(str(root / ATTENTION_70B_TP2_CSV))
    ref_cfg = _config(REFERENCE_MODEL, REFERENCE_GPU, REFERENCE_TP)
    b = decode["batch_size"].to_numpy(dtype=np.float64)
    pred = ref.decode_attention_layer_time(b, b * decode["kv_cache_size"].to_numpy())
    rows.append(_row("decode_attention", ref_cfg, pred, decode["time_ms"].to_numpy() * MS))
    c = prefill["prefill_chunk_size"].to_numpy(dtype=np.float64)
    pred = ref.prefill_attention_layer_time(c, c * (c + prefill["kv_cache_size"].to_numpy()))
    rows.append(_row("prefill_attention", ref_cfg, pred, prefill["time_ms"].to_numpy() * MS))

    for path in sorted(root.glob("network/*/all_reduce.csv")):
        topo = path.parts[-2]
        gpu_dir = topo.split("_")[0]
        if gpu_dir not in VIDUR_GPUS:
            continue
        df = _read_csv(str(path))
        configs = df[["num_workers", "devices_per_node"]].drop_duplicates()
        for nw, dpn in sorted((int(a), int(b)) for a, b in configs.itertuples(index=False)):
            domain = 2 if topo.endswith("pairwise_nvlink") else dpn
            gpu = catalog.gpu_spec(VIDUR_GPUS[gpu_dir]).model_copy(update={"nvlink_gpus": domain})
            rm = RooflineCostModel(ref.model, gpu, 1, params)
            measured = load_all_reduce_rows(path, nw, dpn)
            pred = rm.all_reduce_once_time(measured["size"].to_numpy(), workers=nw)
            if dpn < nw:
                group = "all_reduce_cross_node"
            elif gpu.uses_nvlink(nw):
                group = "all_reduce_nvlink"
            else:
                group = "all_reduce_pcie"
            cfg = f"{topo} workers={nw} per_node={dpn}"
            rows.append(_row(group, cfg, pred, measured["time_ms"].to_numpy() * MS))
    return rows


GROUPS: tuple[str, ...] = (
    "non_attention",
    "decode_attention",
    "prefill_attention",
    "all_reduce_nvlink",
    "all_reduce_pcie",
    "all_reduce_cross_node",
)


def group_summary(rows: Iterable[ValidationRow]) -> dict[str, dict[str, Any]]:
    """Per group: configurations, points, and the median / p90 relative error over all its
    points pooled, and the worst configuration's median."""
    by: dict[str, list[ValidationRow]] = {}
    for r in rows:
        by.setdefault(r.group, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for g in sorted(by, key=lambda g: GROUPS.index(g) if g in GROUPS else len(GROUPS)):
        rs = by[g]
        pooled = np.concatenate([np.asarray(r.rel_errors) for r in rs])
        worst = max(rs, key=lambda r: r.median_rel_err)
        out[g] = {
            "configs": len(rs),
            "n": int(pooled.size),
            "median_rel_err": _sig(float(np.median(pooled)), 4),
            "p90_rel_err": _sig(float(np.quantile(pooled, 0.9)), 4),
            "worst_config": worst.config,
            "worst_config_median_rel_err": _sig(worst.median_rel_err, 4),
        }
    return out


def format_table(rows: Iterable[ValidationRow]) -> str:
    """The validation rows and group summaries as a fixed-width text table."""
    rows = list(rows)
    lines = [
        f"{'group':<22} {'configuration':<42} {'n':>6} {'median':>7} {'p90':>7} {'signed':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r.group:<22} {r.config:<42} {r.n:>6} {r.median_rel_err:>7.1%} "
            f"{r.p90_rel_err:>7.1%} {r.signed_median:>+7.1%}"
        )
    lines.append("")
    lines.append(
        f"{'group (all points pooled)':<30} {'configs':>7} {'n':>7} {'median':>7} {'p90':>7}"
    )
    for g, s in group_summary(rows).items():
        lines.append(
            f"{g:<30} {s['configs']:>7} {s['n']:>7} {s['median_rel_err']:>7.1%} "
            f"{s['p90_rel_err']:>7.1%}"
        )
    return "\n".join(lines)


def _roofline_error_for(rows: list[ValidationRow], pair: VidurPair, tp: int) -> dict[str, Any]:
    """The validation rows that concern one calibrated profile."""
    cfg = _config(pair.model_key, pair.gpu_dir, tp)
    out: dict[str, Any] = {
        "params": "default RooflineParams, without the LM head (Vidur does not time it)",
    }
    for r in rows:
        if r.config == cfg:
            out[r.group] = r.as_dict()
    topo = all_reduce_topology(pair.gpu_dir, tp)
    if topo is not None:
        want = f"{topo} workers={tp} per_node={tp}"
        for r in rows:
            if r.config == want:
                out[r.group] = {"data": want, **r.as_dict()}
    return out
