"""Per-request metrics and run summaries: pure functions of request timelines.

Definitions (all times in seconds):

* TTFT: first token delivery − arrival.
* TPOT: mean gap between tokens after the first, ``(last − first) / (n − 1)``; ATGT
  (Aladdin's average token generation time ``t_decode / (l_out − 1)``) is the same quantity
  and is reported under both names because the papers use both.
* max gap: the longest pause between consecutive tokens (what a reader notices).
* e2e: finish − arrival; normalized latency (BROS): e2e / output tokens.
* QoE: :func:`sloserve.metrics.qoe.andes_qoe`; aborted requests are scored in flight at
  their abort time and rejected ones score 0 (they never got a token).
* SLO attainment: a request with any SLO attains it when it finishes and meets every target
  it has; rejected and aborted requests count as misses. Requests with no SLO are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sloserve.core.request import Request, RequestStatus
from sloserve.metrics.qoe import andes_qoe

_PCTS = (50, 90, 99)


def token_times(req: Request, iter_end: NDArray[np.float64]) -> NDArray[np.float64]:
    """Delivery time of each token of ``req`` from its instance's iteration log.

    After a failover the client timeline is the tokens streamed before the failure
    (``req.streamed_times``) followed by the serving replica's tokens beyond them: the
    regenerated ones are not delivered twice.
    """
    if req.streamed_times:
        prior = np.asarray(req.streamed_times, dtype=np.float64)
        return np.concatenate((prior, _served_times(req.token_runs, iter_end)[prior.size :]))
    return _served_times(req.token_runs, iter_end)


def _served_times(runs: list[int], iter_end: NDArray[np.float64]) -> NDArray[np.float64]:
    if not runs:
        return np.empty(0)
    if len(runs) == 2:
        return iter_end[runs[0] : runs[1] + 1]
    return np.concatenate([iter_end[runs[i] : runs[i + 1] + 1] for i in range(0, len(runs), 2)])


_COLUMNS = (
    "req_id",
    "instance",
    "class",
    "priority",
    "model",
    "status",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "generated_tokens",
    "queue_s",
    "ttft_s",
    "tpot_s",
    "atgt_s",
    "max_gap_s",
    "e2e_s",
    "normalized_latency_s",
    "finish_s",
    "qoe",
    "preemptions",
    "swaps",
    "slo_ttft_s",
    "slo_tpot_s",
    "slo_deadline_s",
    "qoe_ttft_s",
    "qoe_tokens_per_s",
    "ttft_ok",
    "tpot_ok",
    "deadline_ok",
    "slo_ok",
    "reject_reason",
)
"""The request table's columns (also those of an empty run's table)."""


def request_table(
    requests: Sequence[Request], iter_ends: Mapping[int, NDArray[np.float64]]
) -> pd.DataFrame:
    """One row per request with its timeline metrics and SLO outcomes."""
    nan = float("nan")
    rows: list[dict[str, Any]] = []
    for r in requests:
        t = (
            token_times(r, iter_ends[r.instance_id])
            if r.token_runs or r.streamed_times
            else np.empty(0)
        )
        n = t.size
        ttft = float(t[0]) - r.arrival if n else nan
        tpot = (float(t[-1]) - float(t[0])) / (n - 1) if n > 1 else nan
        max_gap = float(np.max(np.diff(t))) if n > 1 else nan
        finished = r.status is RequestStatus.FINISHED
        e2e = (r.finish_time - r.arrival) if finished and r.finish_time is not None else nan
        qoe = nan
        if r.qoe is not None:
            if r.status is RequestStatus.REJECTED:
                qoe = 0.0
            elif finished:
                qoe = andes_qoe(r.arrival, t, r.qoe.ttft_s, r.qoe.tokens_per_s)
            elif r.finish_time is not None:
                qoe = andes_qoe(
                    r.arrival,
                    t,
                    r.qoe.ttft_s,
                    r.qoe.tokens_per_s,
                    now=r.finish_time,
                    total_tokens=r.true_output_len,
                )
        slo = r.slo
        ttft_ok = _meets(slo.ttft_s, ttft, finished or n > 0)
        tpot_ok = _meets(slo.tpot_s, tpot if n > 1 else 0.0, finished)
        dl_ok = _meets(slo.deadline_s, e2e, finished)
        has_slo = not slo.empty
        slo_ok: float = nan
        if has_slo:
            slo_ok = float(finished and all(v != 0.0 for v in (ttft_ok, tpot_ok, dl_ok) if v == v))
        rows.append(
            {
                "req_id": r.req_id,
                "instance": r.instance_id,
                "class": r.req_class.value,
                "priority": r.priority,
                "model": r.model,
                "status": r.status.name.lower(),
                "arrival_s": r.arrival,
                "prompt_tokens": r.num_prompt_tokens,
                "output_tokens": r.true_output_len,
                "generated_tokens": r.num_output_tokens,
                "queue_s": (r.first_scheduled - r.arrival)
                if r.first_scheduled is not None
                else nan,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "atgt_s": tpot,
                "max_gap_s": max_gap,
                "e2e_s": e2e,
                "normalized_latency_s": e2e / r.true_output_len if finished else nan,
                "finish_s": r.finish_time if r.finish_time is not None else nan,
                "qoe": qoe,
                "preemptions": r.num_preemptions,
                "swaps": r.num_swaps,
                "slo_ttft_s": slo.ttft_s if slo.ttft_s is not None else nan,
                "slo_tpot_s": slo.tpot_s if slo.tpot_s is not None else nan,
                "slo_deadline_s": slo.deadline_s if slo.deadline_s is not None else nan,
                "qoe_ttft_s": r.qoe.ttft_s if r.qoe is not None else nan,
                "qoe_tokens_per_s": r.qoe.tokens_per_s if r.qoe is not None else nan,
                "ttft_ok": ttft_ok,
                "tpot_ok": tpot_ok,
                "deadline_ok": dl_ok,
                "slo_ok": slo_ok,
                "reject_reason": r.reject_reason,
            }
        )
    # columns= keeps a run without requests a table with the same columns
    return pd.DataFrame(rows, columns=list(_COLUMNS))


def _meets(target: float | None, value: float, observed: bool) -> float:
    """1.0 met, 0.0 missed (or never observed), NaN when there is no such target."""
    if target is None:
        return float("nan")
    if not observed or value != value:
        return 0.0
    return 1.0 if value <= target + 1e-12 else 0.0


def _stats(prefix: str, values: pd.Series, out: dict[str, Any]) -> None:
    v = values.dropna().to_numpy(dtype=np.float64)
    out[f"{prefix}_mean"] = float(v.mean()) if v.size else None
    for p in _PCTS:
        out[f"{prefix}_p{p}"] = float(np.percentile(v, p)) if v.size else None


def _rate(x: pd.Series) -> float | None:
    v = x.dropna()
    return float(v.mean()) if len(v) else None


def summarize(
    table: pd.DataFrame,
    *,
    simulated_seconds: float,
    wall_seconds: float,
    policy: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-serialisable summary of a run (documented in the README)."""
    done = table[table["status"] == "finished"]
    out: dict[str, Any] = {
        "policy": policy,
        "requests": len(table),
        "finished": len(done),
        "rejected": int((table["status"] == "rejected").sum()),
        "aborted": int((table["status"] == "aborted").sum()),
    }
    for col, name in (
        ("ttft_s", "ttft"),
        ("tpot_s", "tpot"),
        ("e2e_s", "e2e"),
        ("normalized_latency_s", "normalized_latency"),
        ("max_gap_s", "max_gap"),
        ("queue_s", "queue"),
    ):
        _stats(name, done[col], out)
    q = table["qoe"].dropna()
    out["qoe_mean"] = float(q.mean()) if len(q) else None
    out["qoe_p10"] = float(np.percentile(q, 10)) if len(q) else None
    out["qoe_perfect_fraction"] = float((q >= 1.0 - 1e-9).mean()) if len(q) else None
    out["slo_attainment"] = _rate(table["slo_ok"])
    out["ttft_attainment"] = _rate(table["ttft_ok"])
    out["tpot_attainment"] = _rate(table["tpot_ok"])
    out["deadline_attainment"] = _rate(table["deadline_ok"])
    out["slo_attainment_by_class"] = {
        str(c): _rate(g["slo_ok"]) for c, g in table.groupby("class", sort=True)
    }
    span = simulated_seconds if simulated_seconds > 0 else float("nan")
    out["throughput_tokens_per_s"] = (
        float(done["generated_tokens"].sum() / span) if span == span else None
    )
    out["throughput_requests_per_s"] = float(len(done) / span) if span == span else None
    good = table[(table["status"] == "finished") & (table["slo_ok"].fillna(1.0) == 1.0)]
    out["goodput_requests_per_s"] = float(len(good) / span) if span == span else None
    out["preemptions"] = int(table["preemptions"].sum())
    out["swaps"] = int(table["swaps"].sum())
    out["simulated_seconds"] = simulated_seconds
    out["wall_seconds"] = wall_seconds
    if extra:
        out.update(extra)
    return out
