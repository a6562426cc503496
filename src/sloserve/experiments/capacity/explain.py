"""Why the answer is the answer: for the minimum and the configuration one step below it
(or, for a fixed cluster, the highest rate and the failing rate above it), where the SLO
fails — queueing vs prefill share of the missed requests' TTFT, their TPOT, KV pressure,
preemptions, requests shed.

The numbers are the probes' (:mod:`.probe`), of the worst seed; a probe stopped early is
described up to the time it stopped (it says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd


def _pct(x: Any) -> str:
    return "-" if x is None or pd.isna(x) else f"{100 * float(x):.0f}%"


def describe(row: Mapping[str, Any], prefix: str) -> str:
    """One sentence from a row's ``<prefix>_*`` explanation columns."""
    missed = row.get(f"{prefix}_missed")
    if missed is None or pd.isna(missed):
        return "not simulated"
    stopped = row.get(f"{prefix}_stopped_at_s")
    when = (
        f" (stopped early at {float(stopped):g} s: the target could no longer be met)"
        if stopped is not None and not pd.isna(stopped)
        else ""
    )
    if int(missed) == 0:
        return "every request met the SLO" + when
    parts = [f"{int(missed)} requests missed ({row.get(f'{prefix}_missed_by') or '-'})"]
    q, p = row.get(f"{prefix}_queue_share"), row.get(f"{prefix}_prefill_share")
    if q is not None and not pd.isna(q):
        cause = "queueing" if float(q) >= 0.5 else "prefill"
        parts.append(f"their TTFT is {_pct(q)} queueing, {_pct(p)} prefill: {cause}-bound")
    tpot = row.get(f"{prefix}_missed_tpot_s")
    if tpot is not None and not pd.isna(tpot):
        parts.append(f"their mean TPOT {1e3 * float(tpot):.0f} ms")
    kv = row.get(f"{prefix}_kv_usage")
    if kv is not None and not pd.isna(kv):
        parts.append(f"KV usage {_pct(kv)}")
    shed = row.get(f"{prefix}_rejected")
    if shed is not None and not pd.isna(shed) and int(shed) > 0:
        parts.append(f"{int(shed)} rejected")
    pre = row.get(f"{prefix}_preemptions")
    if pre is not None and not pd.isna(pre) and int(pre) > 0:
        parts.append(f"{int(pre)} preemptions")
    return "; ".join(parts) + when


def explain_rows(answers: pd.DataFrame, question: str) -> list[str]:
    """Markdown bullets: per answer, the answer's and its neighbour's explanation."""
    out = []
    at, nb = (
        ("explain_min", "explain_below")
        if question == "fewest-gpus"
        else (
            "explain_max",
            "explain_above",
        )
    )
    for rec in answers.to_dict("records"):
        r = {str(k): v for k, v in rec.items()}
        if question == "fewest-gpus":
            head = (
                f"{r['profile']} | {r['router']} | {r['policy']} | {r['layout']} @ {r['rate']:g}/s"
            )
            if r.get("replicas") is None or pd.isna(r.get("replicas")):
                out.append(f"- {head}: no replica count up to the maximum meets the target")
                continue
            out.append(f"- {head}: {int(r['replicas'])} replicas — {describe(r, at)}")
            if r.get("neighbour_replicas") is not None and not pd.isna(r["neighbour_replicas"]):
                out.append(
                    f"    - {int(r['neighbour_replicas'])} replicas (one below) — {describe(r, nb)}"
                )
        else:
            head = f"{r['router']} | {r['policy']}"
            if r.get("max_rate") is None or pd.isna(r.get("max_rate")):
                out.append(f"- {head}: not even the lowest rate meets the target")
                continue
            out.append(f"- {head}: {r['max_rate']:g}/s — {describe(r, at)}")
            if r.get("failing_rate") is not None and not pd.isna(r["failing_rate"]):
                out.append(f"    - {r['failing_rate']:g}/s (just above) — {describe(r, nb)}")
    return out
