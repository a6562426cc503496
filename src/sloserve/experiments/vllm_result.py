"""A run's results as the JSON ``vllm bench serve --save-result`` writes.

Same keys, same units (milliseconds for latencies, seconds for ``duration``, per-second
throughputs), same definitions as vLLM's ``vllm/benchmarks/serve.py`` (``calculate_metrics``):

* TTFT: first token - arrival (the client sends at its arrival time).
* TPOT (excl. 1st token): ``(e2e - ttft) / (output_tokens - 1)`` for each completed request
  with more than one output token; requests with one token are left out.
* ITL: every gap between consecutive tokens of every completed request, pooled.
* E2EL: last token - arrival.
* ``mean_*``/``median_*``/``std_*`` (population std, numpy's default) and ``p{P}_*`` for
  the selected percentiles (vLLM's default ``--metric-percentiles 99``) of the selected
  metrics (default ``ttft,tpot,itl``; ``e2el`` on request).
* ``completed``: finished requests; ``failed``: rejected or aborted ones (their lengths and
  latencies are left out, as vLLM leaves out failed requests).
* ``duration``: the simulated run's length; throughputs divide by it.
* ``max_output_tokens_per_s``: the most tokens delivered in a one-second bucket from the
  first request; ``max_concurrent_requests``: the most requests in flight at once.

Top-level setup keys follow vLLM's (``date``, ``backend``, ``label``, ``model_id``,
``num_prompts``, ``request_rate``, ``burstiness``, ``max_concurrency``); sloserve adds
``policy``, ``profile`` and ``seed`` as vLLM's ``--metadata KEY=VALUE`` pairs would.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sloserve.core.errors import ConfigError
from sloserve.core.request import RequestStatus
from sloserve.costmodel.profile import load_profile
from sloserve.experiments.runner import RunResult
from sloserve.metrics.summary import token_times

DEFAULT_METRICS = ("ttft", "tpot", "itl")
DEFAULT_PERCENTILES = (99.0,)
VALID_METRICS = ("ttft", "tpot", "itl", "e2el")


def _stats(name: str, values: Sequence[float], pcts: Sequence[float], out: dict[str, Any]) -> None:
    """vLLM's per-metric keys; an empty list counts as [0], as vLLM's ``values or 0``."""
    v = np.asarray(values if len(values) else [0.0], dtype=np.float64) * 1000.0
    out[f"mean_{name}_ms"] = float(np.mean(v))
    out[f"median_{name}_ms"] = float(np.median(v))
    out[f"std_{name}_ms"] = float(np.std(v))
    for p in pcts:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p))


def _arrival_setup(result: RunResult) -> tuple[float | str, float]:
    """``request_rate`` ("inf" when every request arrives at once) and ``burstiness``."""
    arr = result.config.workload.arrival
    rate = getattr(arr, "rate", None)
    cv = getattr(arr, "cv", None)
    if isinstance(rate, (int, float)) and not result.config.workload.uses_trace:
        burst = 1.0 / float(cv) ** 2 if isinstance(cv, (int, float)) and cv > 0 else 1.0
        return float(rate), burst
    # a replayed trace: the measured rate and 1/cv^2 of its inter-arrival times
    times = np.sort(np.asarray([r.arrival for r in result.requests], dtype=np.float64))
    span = float(times[-1] - times[0]) if times.size > 1 else 0.0
    if span <= 0:
        return "inf", 1.0
    gaps = np.diff(times)
    cv2 = float(np.var(gaps) / np.mean(gaps) ** 2) if np.mean(gaps) > 0 else 0.0
    return (times.size - 1) / span, (1.0 / cv2 if cv2 > 0 else 1.0)


def vllm_result(
    result: RunResult,
    *,
    label: str | None = None,
    metrics: Sequence[str] = DEFAULT_METRICS,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    date: str | None = None,
) -> dict[str, Any]:
    """The ``vllm bench serve --save-result`` JSON of ``result`` (see the module docstring).

    ``date`` defaults to now (``%Y%m%d-%H%M%S``, as vLLM); pass one for byte-identical files.
    """
    bad = [m for m in metrics if m not in VALID_METRICS]
    if bad:
        raise ConfigError(f"unknown vLLM metric {bad[0]!r}; valid: {', '.join(VALID_METRICS)}")
    for p in percentiles:
        if not 0 <= p <= 100:
            raise ConfigError(f"percentile {p} must be within 0..100")
    iter_ends: Mapping[int, np.ndarray] = getattr(result, "iter_ends", None) or {-1: np.empty(0)}
    records: list[tuple[float, np.ndarray, int]] = []
    for r in result.requests:
        if r.status is RequestStatus.FINISHED and r.finish_time is not None:
            t = token_times(r, iter_ends.get(r.instance_id, result.iter_end))
            records.append((r.arrival, t, r.num_prompt_tokens))
    duration = float(result.summary.get("simulated_seconds") or 0.0)
    rate, burstiness = _arrival_setup(result)
    out: dict[str, Any] = {
        "date": date or _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "sloserve-sim",
        "backend": "sloserve-sim",
        "label": label or result.config.policy,
        "model_id": _model_name(str(result.config.instance.profile)),
        "tokenizer_id": None,
        "num_prompts": len(result.requests),
        "policy": result.config.policy,
        "profile": str(result.config.instance.profile),
        "seed": result.config.workload.seed,
        "request_rate": rate,
        "burstiness": burstiness,
        "max_concurrency": None,
    }
    out.update(
        vllm_metrics(
            records,
            failed=len(result.requests) - len(records),
            duration=duration,
            metrics=metrics,
            percentiles=percentiles,
        )
    )
    return out


def vllm_metrics(
    records: Sequence[tuple[float, np.ndarray, int]],
    *,
    failed: int,
    duration: float,
    metrics: Sequence[str] = DEFAULT_METRICS,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """vLLM's benchmark metrics from completed requests, each ``(send time, token delivery
    times, prompt tokens)`` on one clock, ``failed`` failed requests and the benchmark's
    ``duration`` in seconds: usable on measured runs too (``benchmarks/serve_load.py``)."""
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    total_in = total_out = 0
    starts: list[float] = []
    ends: list[float] = []
    buckets: dict[int, int] = {}
    t_first = min((s for s, _t, _p in records), default=0.0)
    for start, times, prompt in records:
        t = np.asarray(times, dtype=np.float64)
        n = int(t.size)
        if n == 0:
            continue
        total_in += prompt
        total_out += n
        ttft = float(t[0]) - start
        e2e = float(t[-1]) - start
        ttfts.append(ttft)
        e2els.append(e2e)
        if n > 1:
            tpots.append((e2e - ttft) / (n - 1))
            itls.extend(np.diff(t).tolist())
        starts.append(start)
        ends.append(start + e2e)
        for b in ((t - t_first) // 1.0).astype(np.int64).tolist():
            buckets[b] = buckets.get(b, 0) + 1
    completed = len(ttfts)
    span = duration if duration > 0 else float("nan")
    out: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "failed": failed + len(records) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / span,
        "request_goodput": None,
        "output_throughput": total_out / span,
        "total_token_throughput": (total_in + total_out) / span,
        "max_output_tokens_per_s": float(max(buckets.values(), default=0)),
        "max_concurrent_requests": _peak_concurrency(starts, ends),
        "rtfx": 0.0,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        if name in metrics:
            _stats(name, values, percentiles, out)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def _model_name(profile: str) -> str:
    try:
        return load_profile(profile).model.name
    except Exception:  # a profile that no longer loads: its name still identifies the run
        return profile


def _peak_concurrency(starts: Sequence[float], ends: Sequence[float]) -> int:
    """Most requests in flight at once over half-open intervals [start, end)."""
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    cur = peak = 0
    for _t, d in events:  # ties: -1 sorts first, so an end frees its slot before a start
        cur += d
        peak = max(peak, cur)
    return peak


def parse_percentiles(spec: str) -> tuple[float, ...]:
    """``"50,90,99"`` as floats (vLLM's ``--metric-percentiles``)."""
    try:
        return tuple(float(p) for p in spec.split(",") if p.strip())
    except ValueError:
        raise ConfigError(
            f"--metric-percentiles: expected numbers like 50,99, got {spec!r}"
        ) from None


def vllm_results_text(results: Mapping[str, RunResult], **kw: Any) -> str:
    """One run: its vLLM result JSON. Several: one JSON object per line, each labelled with
    the run's name, as ``vllm bench serve --append-result`` writes a file of several runs."""
    docs = [vllm_result(r, label=name, **kw) for name, r in results.items()]
    if len(docs) == 1:
        return json.dumps(docs[0], indent=2) + "\n"
    return "".join(json.dumps(d) + "\n" for d in docs)
