"""``report.html``: one self-contained page per report folder.

The summary table, interactive CDFs of TTFT, TPOT and end-to-end latency, and the timeline
(running and waiting requests, KV usage; one series per run and replica). No network at view
time: the data is inlined as JSON and the plots are drawn as SVG by the small script below
(hover a plot for values, click a legend entry to hide or show its series). Long series are
thinned to at most :data:`MAX_POINTS` points (CDFs keep their quantiles, timelines their
extremes per bin), so a report of 100k requests stays a few MB.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.experiments.runner import RunResult

MAX_POINTS = 600


def _cdf(values: np.ndarray, scale: float) -> dict[str, list[float]]:
    v = np.sort(values[np.isfinite(values)]) * scale
    if not v.size:
        return {"x": [], "y": []}
    y = np.arange(1, v.size + 1) / v.size
    if v.size > MAX_POINTS:  # evenly spaced quantiles, the last (max) included
        idx = np.unique(np.linspace(0, v.size - 1, MAX_POINTS).round().astype(int))
        v, y = v[idx], y[idx]
    return {"x": [round(float(a), 6) for a in v], "y": [round(float(b), 6) for b in y]}


def _thin(t: np.ndarray, y: np.ndarray) -> dict[str, list[float]]:
    if t.size > MAX_POINTS:  # keep each bin's first, min and max, so peaks stay visible
        bins = np.array_split(np.arange(t.size), MAX_POINTS // 3)
        keep = sorted(
            {int(i) for b in bins if b.size for i in (b[0], b[np.argmin(y[b])], b[np.argmax(y[b])])}
        )
        t, y = t[keep], y[keep]
    return {"x": [round(float(a), 6) for a in t], "y": [round(float(b), 6) for b in y]}


def _hit_points(t: list[float], rate: list[float | None]) -> tuple[list[float], list[float]]:
    """The buckets that looked something up, as (start, hit rate in %)."""
    keep = [(a, 100.0 * b) for a, b in zip(t, rate, strict=True) if b is not None]
    return [round(a, 6) for a, _ in keep], [round(b, 4) for _, b in keep]


def report_data(results: Mapping[str, RunResult]) -> dict[str, Any]:
    """What the page shows, as plain JSON data."""
    from sloserve.experiments.report import SUMMARY_COLUMNS, summary_rows

    cdfs: dict[str, list[dict[str, Any]]] = {"ttft": [], "tpot": [], "e2e": []}
    for name, r in results.items():
        for key, col, scale in (
            ("ttft", "ttft_s", 1.0),
            ("tpot", "tpot_s", 1000.0),
            ("e2e", "e2e_s", 1.0),
        ):
            vals = r.table[col].to_numpy(dtype=np.float64) if col in r.table else np.empty(0)
            cdfs[key].append({"name": name, **_cdf(vals, scale)})
    timeline: dict[str, list[dict[str, Any]]] = {"running": [], "waiting": [], "kv": []}
    for name, r in results.items():
        tr = r.trace
        if not len(tr):
            continue
        groups = (
            [(None, tr)] if "replica" not in tr.columns else list(tr.groupby("replica", sort=True))
        )
        for rep, g in groups:
            label = (
                name if rep is None or tr["replica"].nunique() == 1 else f"{name} · replica {rep!s}"
            )
            t = g["time"].to_numpy(dtype=np.float64)
            timeline["running"].append(
                {"name": label, **_thin(t, g["running"].to_numpy(dtype=np.float64))}
            )
            timeline["waiting"].append(
                {"name": label, **_thin(t, g["waiting"].to_numpy(dtype=np.float64))}
            )
            kv = (
                g["kv_usage"].to_numpy(dtype=np.float64) * 100
                if "kv_usage" in g
                else np.zeros(t.size)
            )
            timeline["kv"].append({"name": label, **_thin(t, kv)})
    timeline["prefix_hit"] = [  # prefix-cache hit rate over time, per replica (if cached)
        {"name": f"{name} · replica {rep['replica']}", "x": xs, "y": ys}
        for name, r in results.items()
        for rep in (r.summary.get("prefix_hits_over_time") or {}).get("replicas", [])
        for xs, ys in [_hit_points(r.summary["prefix_hits_over_time"]["t"], rep["hit_rate"])]
    ]
    first = next(iter(results.values()))
    return {
        "columns": ["run", *(h for _k, h, _f in SUMMARY_COLUMNS)],
        "rows": summary_rows(results),
        "cdfs": cdfs,
        "timeline": timeline,
        "meta": {
            "requests": len(first.requests),
            "profile": str(first.config.instance.profile),
            "seed": first.config.workload.seed,
            "notes": list(first.summary.get("workload_notes") or []),
        },
    }


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left;font-weight:600}
.plots{display:flex;flex-wrap:wrap;gap:16px}.plot{position:relative}
.legend span{cursor:pointer;margin-right:12px;user-select:none;white-space:nowrap}
.legend span.off{opacity:.35;text-decoration:line-through}
.tip{position:absolute;pointer-events:none;background:#fff;border:1px solid #999;padding:2px 6px;
font-size:12px;display:none;white-space:nowrap}
svg text{font-size:11px;fill:#444}.axis{stroke:#888}.grid{stroke:#eee}
"""


def _script() -> str:
    """The plotter (``html_report.js``, shipped as package data), inlined into the page."""
    from importlib import resources

    return resources.files("sloserve.experiments").joinpath("html_report.js").read_text("utf-8")


def render_html(results: Mapping[str, RunResult]) -> str:
    """The page as a string (deterministic: same results, same bytes)."""
    data = report_data(results)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in data["columns"])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
        for row in data["rows"]
    )
    m = data["meta"]
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in m["notes"])
    # "</" inside the JSON would end the script element early
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>sloserve report</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>sloserve report: {len(data['rows'])} run(s), {m['requests']} requests</h1>"
        f"<p>profile {html.escape(str(m['profile']))}, seed {m['seed']}</p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + f"<h2>Summary</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        "<h2>Latency CDFs</h2><p>Hover for values; click a legend entry to hide a series.</p>"
        '<div id="cdfs" class="plots"></div>'
        '<h2>Timeline</h2><div id="timeline" class="plots"></div>'
        f'<script type="application/json" id="data">{payload}</script>'
        f"<script>{_script()}</script></body></html>\n"
    )


def write_html_report(results: Mapping[str, RunResult], out_dir: str | Path) -> Path:
    """Write ``out_dir/report.html``; returns its path."""
    p = Path(out_dir) / "report.html"
    p.write_text(render_html(results), encoding="utf-8")
    return p
