"""Fitting :class:`LinearCoefficients` to a measured-iteration table (:mod:`.profile_csv`).

:func:`fit_profile_csv` fits the same decomposition as the Vidur tables
(:mod:`.vidur_tables`) to whole measured iterations.

Rows with identical aggregates are merged (median of every time) before fitting, so the
hold-out never tests a batch that was also trained on. Then, as for Vidur's tables, points
are sorted by their aggregates and every 5th is held out (the same rows for every group).

*Per-group mode* (each kind of row present has its attention column): decode attention is
``decode_intercept + per_decode_seq·num_decode + per_decode_kv·decode_context_sum`` fitted
to ``time_decode_attention_s``; prefill attention ``prefill_intercept + per_prefill_seq·seqs
+ per_prefill_work·prefill_attn_work`` fitted to ``time_prefill_attention_s``; the comm term
``comm_intercept + comm_per_token·T`` to the positive ``time_comm_s`` cells (else 0); the
non-attention floor+line to the **remainder** ``time_s − Σ(attention, comm)`` over ``T``.
Fitting the remainder rather than ``time_non_attention_s`` makes the terms add up to the
measured total: whatever no group measured (LM head, embedding, launch and Python overhead)
belongs to the per-iteration cost, which is where the simulator needs it. ``intercept`` is 0
(absorbed by the floor). Each group's report has its held-out R² and relative errors.

*Total mode* (no usable group columns): one joint relative-least-squares fit of every term to
``time_s``. The max() is handled as in :func:`fit_floor_line`: every split of the distinct
token counts into a flat prefix (one ``token_floor`` column) and a linear suffix
(``token_intercept`` and ``per_token`` columns) is tried and the split whose max-form has the
least relative squared error is kept. The comm terms are not identifiable from totals
(they are linear in T like the non-attention line) and stay 0, folded into ``per_token``.

In both modes a term whose column is (numerically) a combination of higher-priority ones is
dropped (fixed at 0) and listed under ``dropped`` in the report: a profile with one sequence
per prefill chunk cannot tell ``per_prefill_seq`` from ``prefill_intercept`` (we keep the
intercept, as above), decode-only data cannot tell ``decode_intercept`` from the floor. The
priority is: the non-attention terms, the KV and work terms, the intercepts, the per-sequence
terms. Only ``token_intercept`` may be negative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sloserve.core.errors import ConfigError
from sloserve.costmodel.base import BatchStats
from sloserve.costmodel.fit.lstsq import (
    HOLDOUT_EVERY,
    FloatArray,
    _clean,
    _metrics,
    _round,
    fit_floor_line,
    holdout_mask,
    relative_lstsq,
)
from sloserve.costmodel.fit.profile_csv import (
    CSV_GROUP_COLUMNS,
    CSV_INPUT_COLUMNS,
    CSV_TIME_COLUMN,
    ProfileTable,
    read_profile_csv,
    validate_profile_frame,
)
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel

MIN_CSV_POINTS = HOLDOUT_EVERY
"""Fewest distinct measured batches :func:`fit_profile_table` accepts (one is held out)."""

_DECODE_TERMS = ("decode_intercept", "per_decode_seq", "per_decode_kv")
_PREFILL_TERMS = ("prefill_intercept", "per_prefill_seq", "per_prefill_work")
_RANK_RTOL = 1e-7
"""A column whose normalised residual against the kept columns is below this is dropped."""

CSV_HOLDOUT = (
    f"rows with identical aggregates merged (median); points sorted by their aggregates; every "
    f"{HOLDOUT_EVERY}th (index % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1}) held out for every "
    "group; coefficients fitted on the rest by relative least squares; errors are "
    "|pred − measured| / measured on the held-out points"
)


# --------------------------------------------------------------------------- CSV fitting


def _merge_duplicates(frame: pd.DataFrame) -> pd.DataFrame:
    """One point per distinct aggregate tuple (median of every time), sorted by aggregates."""
    merged = frame.groupby(list(CSV_INPUT_COLUMNS), as_index=False, sort=True).median()
    return merged.reset_index(drop=True)


def _select_columns(x: FloatArray, y: FloatArray, order: Sequence[int]) -> list[int]:
    """Columns of ``x`` (tried in ``order``) that are not combinations of those kept before.

    Works on the relative-error-weighted, column-normalised matrix, so the test matches the
    least-squares problem actually solved.
    """
    xw = x / y[:, None]
    kept: list[int] = []
    for j in order:
        col = xw[:, j]
        norm = float(np.linalg.norm(col))
        if norm == 0:
            continue
        col = col / norm
        if kept:
            basis = xw[:, kept] / np.linalg.norm(xw[:, kept], axis=0)
            sol, *_ = np.linalg.lstsq(basis, col, rcond=None)
            resid = float(np.linalg.norm(col - basis @ sol))
        else:
            resid = 1.0
        if resid > _RANK_RTOL**0.5:
            kept.append(j)
    return kept


def _fit_terms(
    columns: Mapping[str, FloatArray], y: FloatArray, priority: Sequence[str], signed: Sequence[str]
) -> tuple[dict[str, float], list[str]]:
    """Relative least squares of ``y`` on the named columns; (coefficients, dropped names).

    Columns are kept in ``priority`` order while identifiable; all but ``signed`` are ≥ 0.
    """
    names = list(priority)
    x = np.column_stack([columns[n] for n in names])
    kept = _select_columns(x, y, range(len(names)))
    coef = relative_lstsq(x[:, kept], y, [names[j] not in signed for j in kept])
    out = dict.fromkeys(names, 0.0)
    for j, c in zip(kept, coef, strict=True):
        out[names[j]] = float(c)
    return out, [n for j, n in enumerate(names) if j not in kept]


@dataclass(frozen=True)
class _Points:
    """The merged points of a profile table as arrays."""

    n_p: FloatArray
    seqs: FloatArray
    work: FloatArray
    n_d: FloatArray
    ctx: FloatArray
    time: FloatArray

    @property
    def tokens(self) -> FloatArray:
        return self.n_p + self.n_d

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _Points:
        def col(name: str) -> FloatArray:
            return frame[name].to_numpy(dtype=np.float64)

        return cls(
            col("num_prefill_tokens"),
            col("num_prefill_seqs"),
            col("prefill_attn_work"),
            col("num_decode"),
            col("decode_context_sum"),
            col(CSV_TIME_COLUMN),
        )

    def subset(self, mask: NDArray[np.bool_]) -> _Points:
        return _Points(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def _predict(c: Mapping[str, float], p: _Points) -> FloatArray:
    """:class:`LinearCostModel`'s formula, vectorised over points."""
    tokens = p.tokens
    t = (
        c["intercept"]
        + np.maximum(c["token_floor"], c["token_intercept"] + c["per_token"] * tokens)
        + c["comm_intercept"]
        + c["comm_per_token"] * tokens
    )
    dec = c["decode_intercept"] + c["per_decode_seq"] * p.n_d + c["per_decode_kv"] * p.ctx
    pre = c["prefill_intercept"] + c["per_prefill_seq"] * p.seqs + c["per_prefill_work"] * p.work
    out: FloatArray = t + np.where(p.n_d > 0, dec, 0.0) + np.where(p.n_p > 0, pre, 0.0)
    return out


def _group_fit(
    name: str,
    form: str,
    target: str,
    columns: Mapping[str, FloatArray],
    y: FloatArray,
    rows: NDArray[np.bool_],
    test: NDArray[np.bool_],
    priority: Sequence[str],
    source: str,
) -> tuple[dict[str, float], dict[str, Any], list[str]]:
    train = rows & ~test
    if not train.any():
        raise ConfigError(
            f"{source}: no training points for {name} (every {HOLDOUT_EVERY}th point is "
            "held out); measure more batches of that kind"
        )
    sub = {k: v[train] for k, v in columns.items()}
    coef, dropped = _fit_terms(sub, y[train], priority, signed=())
    x_test = np.column_stack([columns[n][rows & test] for n in priority])
    pred = x_test @ np.array([coef[n] for n in priority]) if x_test.size else np.zeros(0)
    report: dict[str, Any] = {
        "form": form,
        "target": target,
        "coefficients_s": {k: _round(v) for k, v in coef.items()},
        "dropped": dropped,
        **_metrics(pred, y[rows & test], int(train.sum())),
    }
    return coef, report, dropped


def _fit_total_joint(p: _Points, train: NDArray[np.bool_]) -> tuple[dict[str, float], list[str]]:
    """Every term jointly to ``time_s`` (total mode; see the module docstring)."""
    q = p.subset(train)
    tokens = q.tokens
    ones = np.ones_like(tokens)
    has_d, has_p = (q.n_d > 0).astype(np.float64), (q.n_p > 0).astype(np.float64)
    priority = (
        "token_floor",
        "token_intercept",
        "per_token",
        "per_decode_kv",
        "per_prefill_work",
        "decode_intercept",
        "prefill_intercept",
        "per_decode_seq",
        "per_prefill_seq",
    )
    zero = dict.fromkeys(LinearCoefficients.model_fields, 0.0)
    best: tuple[float, dict[str, float], list[str]] | None = None
    distinct = np.unique(tokens)
    # A threshold splits the points into a flat prefix (tokens < thr) and a linear suffix.
    for thr in [*distinct, np.inf]:
        flat = tokens < thr
        lin = ~flat
        cols = {
            "token_floor": flat * ones,
            "token_intercept": lin * ones,
            "per_token": lin * tokens,
            "decode_intercept": has_d,
            "per_decode_seq": q.n_d,
            "per_decode_kv": q.ctx,
            "prefill_intercept": has_p,
            "per_prefill_seq": q.seqs,
            "per_prefill_work": q.work,
        }
        coef, dropped = _fit_terms(cols, q.time, priority, signed=("token_intercept",))
        full = {**zero, **coef}
        loss = float(np.sum(((_predict(full, q) - q.time) / q.time) ** 2))
        if best is None or loss < best[0]:
            best = (loss, full, dropped)
    assert best is not None
    return best[1], best[2]


def _kind_masks(p: _Points) -> dict[str, NDArray[np.bool_]]:
    return {
        "decode_only": (p.n_d > 0) & (p.n_p == 0),
        "prefill_only": (p.n_p > 0) & (p.n_d == 0),
        "hybrid": (p.n_p > 0) & (p.n_d > 0),
    }


def fit_profile_table(table: ProfileTable) -> tuple[LinearCoefficients, dict[str, Any]]:
    """Fit :class:`LinearCoefficients` to a validated table; (coefficients, report).

    Per-group mode when the attention columns cover every kind of row present, else total
    mode (module docstring). The report is plain data (YAML/JSON
    safe) with the held-out R² and relative errors of every fitted group and of the total.
    """
    source = table.source
    frame = _merge_duplicates(table.frame)
    n = len(frame)
    if n < MIN_CSV_POINTS:
        raise ConfigError(
            f"{source}: {n} distinct measured batches; need at least {MIN_CSV_POINTS} "
            f"(every {HOLDOUT_EVERY}th is held out)"
        )
    p = _Points.of(frame)
    test = holdout_mask(n)
    train = ~test
    tokens = p.tokens
    if np.unique(tokens[train]).size < 2:
        raise ConfigError(
            f"{source}: the training points have one token count; the per-token cost needs "
            "at least two (vary the chunk sizes and batch sizes)"
        )
    has_d, has_p = p.n_d > 0, p.n_p > 0
    col_dec = CSV_GROUP_COLUMNS["decode_attention"]
    col_pre = CSV_GROUP_COLUMNS["prefill_attention"]
    col_comm = CSV_GROUP_COLUMNS["comm"]
    dec_ok = not has_d.any() or col_dec in frame.columns
    pre_ok = not has_p.any() or col_pre in frame.columns
    any_attn = col_dec in frame.columns or col_pre in frame.columns
    per_group = dec_ok and pre_ok and any_attn

    def group_time(col: str) -> FloatArray:
        if col not in frame.columns:
            return np.zeros(n)
        out: FloatArray = np.nan_to_num(frame[col].to_numpy(dtype=np.float64))
        return out

    coef: dict[str, float] = dict.fromkeys(LinearCoefficients.model_fields, 0.0)
    groups: dict[str, Any] = {}
    dropped: list[str] = []
    notes: list[str] = []
    if per_group:
        ones = np.ones(n)
        dec_t, pre_t, comm_t = group_time(col_dec), group_time(col_pre), group_time(col_comm)
        if has_d.any():
            c, rep, dr = _group_fit(
                "decode attention",
                "decode_intercept + per_decode_seq·num_decode + per_decode_kv·decode_context_sum",
                col_dec,
                {"decode_intercept": ones, "per_decode_seq": p.n_d, "per_decode_kv": p.ctx},
                dec_t,
                has_d,
                test,
                ("per_decode_kv", "decode_intercept", "per_decode_seq"),
                source,
            )
            coef.update(c)
            groups["decode_attention"] = rep
            dropped += dr
        if has_p.any():
            c, rep, dr = _group_fit(
                "prefill attention",
                "prefill_intercept + per_prefill_seq·num_prefill_seqs "
                "+ per_prefill_work·prefill_attn_work",
                col_pre,
                {"prefill_intercept": ones, "per_prefill_seq": p.seqs, "per_prefill_work": p.work},
                pre_t,
                has_p,
                test,
                ("per_prefill_work", "prefill_intercept", "per_prefill_seq"),
                source,
            )
            coef.update(c)
            groups["prefill_attention"] = rep
            dropped += dr
        comm_rows = comm_t > 0
        if comm_rows.any():
            c, rep, dr = _group_fit(
                "comm",
                "comm_intercept + comm_per_token·T",
                col_comm,
                {"comm_intercept": ones, "comm_per_token": tokens},
                comm_t,
                comm_rows,
                test,
                ("comm_intercept", "comm_per_token"),
                source,
            )
            coef.update(c)
            groups["comm"] = rep
            dropped += dr
        rest = p.time - dec_t - pre_t - comm_t
        curve = fit_floor_line(tokens[train], rest[train])
        coef.update(token_floor=curve.floor, token_intercept=curve.intercept, per_token=curve.slope)
        groups["non_attention"] = {
            "form": "max(token_floor, token_intercept + per_token·T), T = all tokens",
            "target": "time_s − Σ(attention, comm): the remainder of each iteration",
            "coefficients_s": {
                "token_floor": _round(curve.floor),
                "token_intercept": _round(curve.intercept),
                "per_token": _round(curve.slope),
            },
            "knee_tokens": _round(curve.knee, 4),
            **_metrics(curve(tokens[test]), rest[test], int(train.sum())),
        }
        col_na = CSV_GROUP_COLUMNS["non_attention"]
        if col_na in frame.columns:
            na = frame[col_na].to_numpy(dtype=np.float64)
            ok = ~np.isnan(na)
            if ok.any():
                groups["non_attention"]["measured_over_remainder_median"] = _round(
                    float(np.median(na[ok] / rest[ok])), 4
                )
    else:
        full, dropped = _fit_total_joint(p, train)
        coef.update(full)
        if any_attn:
            notes.append(
                "attention columns do not cover every kind of batch present: fitted to time_s"
            )
        if col_comm in frame.columns:
            notes.append("comm cannot be separated from totals: folded into per_token")
    coefficients = LinearCoefficients(**{k: _round(v) for k, v in coef.items()})

    cm = LinearCostModel(coefficients)
    pred = np.array(
        [
            cm.batch_time(BatchStats(int(a), int(b), int(c), int(d), int(e)))
            for a, b, c, d, e in frame[list(CSV_INPUT_COLUMNS)].itertuples(index=False)
        ],
        dtype=np.float64,
    )
    n_train = int(train.sum())
    total: dict[str, Any] = {
        "form": "LinearCostModel.batch_time with the fitted coefficients",
        **_metrics(pred[test], p.time[test], n_train),
        "train": _metrics(pred[train], p.time[train], n_train),
        "by_kind": {
            kind: _metrics(pred[m & test], p.time[m & test], int((m & train).sum()))
            for kind, m in _kind_masks(p).items()
            if m.any()
        },
    }
    report: dict[str, Any] = {
        "data": source,
        "mode": "per-group" if per_group else "total",
        "rows": len(table.frame),
        "points": n,
        "holdout": CSV_HOLDOUT,
        "groups": groups,
        "total": total,
        "dropped_terms": sorted(set(dropped)),
        "metadata": {k: str(v) for k, v in table.metadata.items()},
        "ignored_columns": list(table.ignored_columns),
    }
    if notes:
        report["notes"] = notes
    return coefficients, _clean(report)


def fit_profile_csv(path: str | Path) -> tuple[LinearCoefficients, dict[str, Any]]:
    """Fit a measured-iteration CSV (format: :mod:`.profile_csv`); (coefficients, report).

    Raises :class:`ConfigError` naming file, line and column for a malformed CSV.
    """
    return fit_profile_table(read_profile_csv(path))


def fit_profile_frame(
    df: pd.DataFrame, source: str = "<DataFrame>"
) -> tuple[LinearCoefficients, dict[str, Any]]:
    """:func:`fit_profile_csv` for a table in memory (e.g. :func:`profile_model`'s output)."""
    return fit_profile_table(validate_profile_frame(df.reset_index(drop=True), source))


def format_fit_report(report: Mapping[str, Any]) -> str:
    """A few lines for a terminal: mode, points, and held-out errors per group and total."""

    def line(name: str, g: Mapping[str, Any]) -> str:
        if not g.get("n_test"):
            return f"  {name}: no held-out points (n_train {g.get('n_train')})"
        r2 = g.get("r2")
        r2s = "n/a" if r2 is None else f"{r2:.4f}"
        return (
            f"  {name}: held-out median rel err {g['median_rel_err']:.1%}, "
            f"p90 {g['p90_rel_err']:.1%}, max {g['max_rel_err']:.1%}, R² {r2s} "
            f"(train {g['n_train']}, test {g['n_test']})"
        )

    out = [
        f"{report.get('data')}: {report.get('points')} distinct batches "
        f"({report.get('rows')} rows), {report.get('mode')} fit"
    ]
    for name, g in report.get("groups", {}).items():
        out.append(line(name, g))
    total = report.get("total", {})
    out.append(line("total", total))
    for kind, g in total.get("by_kind", {}).items():
        out.append(line(f"total, {kind}", g))
    if report.get("dropped_terms"):
        out.append(f"  not identifiable, fixed at 0: {', '.join(report['dropped_terms'])}")
    out.extend(f"  note: {n}" for n in report.get("notes", []))
    return "\n".join(out)
