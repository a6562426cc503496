"""A run as a Chrome / Perfetto trace (Trace Event Format JSON).

Open the file in https://ui.perfetto.dev or ``chrome://tracing``. Layout:

* one **process** per replica (``pid`` = replica + 1, named ``replica N``; a single-replica
  run has one);
* in it, thread 0 (``batches``): one complete slice (``ph: X``) per scheduling decision,
  its ``args`` holding the batch size, tokens, iterations (a fast-forwarded run of
  identical iterations is one slice of ``iterations`` iterations), running/waiting counts and
  KV usage; plus counter tracks (``ph: C``) of running, waiting and KV usage;
* one **thread per request** (``tid`` = request id + 1, named ``req N``) with slices
  ``queued``, ``prefill`` (admission to the first token: every chunk of the prompt; the
  batch slices above it show the iterations), ``decode`` (first to last token of a running
  stretch), ``recompute`` (a refill after a preemption or a failover, until the next new
  token), ``preempted`` (KV dropped), ``swapped`` (KV on the CPU tier), and instant events
  (``ph: i``) ``failed over``, ``rejected``, ``aborted``. A request that failed over has
  slices on both replicas' processes, on its own thread.

Times are the simulated clock in microseconds (``ts``/``dur``). Built from a
:class:`~sloserve.experiments.runner.RunResult` alone: the request table and per-token
times, each request's state changes (:attr:`Request.transitions`) and the instance trace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request, RequestStatus
from sloserve.experiments.runner import RunResult
from sloserve.metrics.summary import token_times

US = 1e6
_W, _R, _PR, _PS = (
    int(RequestStatus.WAITING),
    int(RequestStatus.RUNNING),
    int(RequestStatus.PREEMPTED_RECOMPUTE),
    int(RequestStatus.PREEMPTED_SWAPPED),
)


def _us(t: float) -> float:
    return round(t * US, 3)


def _replica_of(result: RunResult) -> dict[int, int]:
    tr = result.trace
    if "replica" in tr.columns and "instance" in tr.columns and len(tr):
        pairs = tr[["instance", "replica"]].drop_duplicates()
        return {int(i): int(r) for i, r in zip(pairs["instance"], pairs["replica"], strict=True)}
    return {}


def _slice(name: str, pid: int, tid: int, t0: float, t1: float, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "name": name,
        "cat": "request",
        "ph": "X",
        "ts": _us(t0),
        "dur": max(0.0, round(_us(t1) - _us(t0), 3)),
        "pid": pid,
        "tid": tid,
    }
    if args:
        ev["args"] = args
    return ev


def _instant(name: str, pid: int, tid: int, t: float, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "name": name,
        "cat": "request",
        "ph": "i",
        "s": "t",
        "ts": _us(t),
        "pid": pid,
        "tid": tid,
    }
    if args:
        ev["args"] = args
    return ev


def _request_events(
    r: Request, times: np.ndarray, pid_of: Any, end_of_run: float
) -> list[dict[str, Any]]:
    """The slices of one request, from its state changes and token times."""
    tid = r.req_id + 1
    out: list[dict[str, Any]] = []
    trans = r.transitions
    # (start, state, instance) stretches: arrival WAITING, then each transition
    states: list[tuple[float, int, int]] = [(r.arrival, _W, -1), *trans]
    for k, (t0, st, inst) in enumerate(states):
        if st not in (_W, _R, _PR, _PS):
            continue  # terminal: handled below
        t1 = states[k + 1][0] if k + 1 < len(states) else end_of_run
        nxt_inst = states[k + 1][2] if k + 1 < len(states) else inst
        if st == _W:
            if k > 0 and states[k - 1][1] in (_W, _R, _PR, _PS):
                # a WAITING after a live state: the replica holding it failed
                out.append(_instant("failed over", pid_of(inst), tid, t0, replica=pid_of(inst) - 1))
            where = nxt_inst if nxt_inst >= 0 else inst
            out.append(_slice("queued", pid_of(where), tid, t0, t1))
            continue
        pid = pid_of(inst)
        if st == _PR:
            out.append(_slice("preempted", pid, tid, t0, t1, kv="dropped"))
            continue
        if st == _PS:
            out.append(_slice("swapped", pid, tid, t0, t1, kv="on the CPU tier"))
            continue
        # RUNNING: a prefill / recompute stretch until the next new token, then decode
        before = int(np.searchsorted(times, t0, side="right"))
        inside = int(np.searchsorted(times, t1, side="right")) - before
        prev = states[k - 1][1] if k > 0 else _W
        if inside == 0:
            if prev == _PS:  # swapped back in, no token yet
                out.append(_slice("decode", pid, tid, t0, t1, tokens=0))
            else:
                name = "prefill" if before == 0 else "recompute"
                out.append(_slice(name, pid, tid, t0, t1, prompt_tokens=r.num_prompt_tokens))
            continue
        first = float(times[before])
        if prev == _PS:
            out.append(_slice("decode", pid, tid, t0, t1, tokens=inside))
            continue
        name = "prefill" if before == 0 else "recompute"
        out.append(_slice(name, pid, tid, t0, first, prompt_tokens=r.num_prompt_tokens))
        if inside > 1 or t1 > first:
            out.append(_slice("decode", pid, tid, first, t1, tokens=inside))
    last_t, last_st, last_inst = states[-1]
    if last_st == int(RequestStatus.REJECTED):
        out.append(_instant("rejected", pid_of(last_inst), tid, last_t, reason=r.reject_reason))
    elif last_st == int(RequestStatus.ABORTED):
        out.append(_instant("aborted", pid_of(last_inst), tid, last_t))
    return out


def chrome_trace(result: RunResult) -> dict[str, Any]:
    """The Trace Event Format document (``{"traceEvents": [...], ...}``) of ``result``."""
    replica_of = _replica_of(result)

    def pid_of(instance: int) -> int:
        return replica_of.get(instance, 0) + 1

    iter_ends: Mapping[int, np.ndarray] = getattr(result, "iter_ends", None) or {}
    end_of_run = float(result.summary.get("simulated_seconds") or 0.0)
    events: list[dict[str, Any]] = []
    threads: dict[tuple[int, int], str] = {}
    for r in result.requests:
        ie = iter_ends.get(r.instance_id, result.iter_end)
        times = token_times(r, ie) if (r.token_runs or r.streamed_times) else np.empty(0)
        evs = _request_events(r, np.asarray(times, dtype=np.float64), pid_of, end_of_run)
        for ev in evs:
            threads[(ev["pid"], ev["tid"])] = f"req {r.req_id}"
        events.extend(evs)
    tr = result.trace
    replicas = sorted({pid for pid, _ in threads} | {1})
    if len(tr):
        reps = tr["replica"].to_numpy() if "replica" in tr.columns else np.zeros(len(tr), int)
        kv = tr["kv_usage"].to_numpy() if "kv_usage" in tr.columns else np.zeros(len(tr))
        cols = [tr[c].to_numpy() for c in ("time", "duration", "batch_size", "batch_tokens")]
        steps, running, waiting = (tr[c].to_numpy() for c in ("steps", "running", "waiting"))
        for i in range(len(tr)):
            pid = int(reps[i]) + 1
            t, d, size, tok = float(cols[0][i]), float(cols[1][i]), cols[2][i], cols[3][i]
            k = int(steps[i])
            events.append(
                {
                    "name": "batch",
                    "cat": "batch",
                    "ph": "X",
                    "ts": _us(t),
                    "dur": round(_us(t + d) - _us(t), 3),
                    "pid": pid,
                    "tid": 0,
                    "args": {
                        "batch_size": int(size),
                        "tokens_per_iteration": int(tok),
                        "iterations": k,
                        "running": int(running[i]),
                        "waiting": int(waiting[i]),
                        "kv_usage": round(float(kv[i]), 6),
                    },
                }
            )
            events.append(
                {
                    "name": "queue",
                    "ph": "C",
                    "ts": _us(t),
                    "pid": pid,
                    "args": {"running": int(running[i]), "waiting": int(waiting[i])},
                }
            )
            events.append(
                {
                    "name": "KV usage",
                    "ph": "C",
                    "ts": _us(t),
                    "pid": pid,
                    "args": {"percent": round(100 * float(kv[i]), 4)},
                }
            )
            replicas = sorted(set(replicas) | {pid})
    meta: list[dict[str, Any]] = []
    for pid in replicas:
        meta.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"replica {pid - 1}"},
            }
        )
        meta.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": pid},
            }
        )
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "batches"}}
        )
    for (pid, tid), name in sorted(threads.items()):
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        meta.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    events.sort(key=lambda e: (e["ts"], e["pid"], e.get("tid", 0)))
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "sloserve",
            "policy": result.config.policy,
            "profile": str(result.config.instance.profile),
            "seed": result.config.workload.seed,
            "clock": "simulated seconds x 1e6 (microseconds)",
        },
    }


def per_run_paths(path: str | Path, names: Sequence[str]) -> list[Path]:
    """``path`` for one run; else one file per run, the run's name before the suffix
    (``t.json`` -> ``t.vllm.json``, ``t.sarathi.json``; ``vllm / rr`` -> ``vllm_rr``)."""
    p = Path(path)
    if len(names) == 1:
        return [p]
    suffix = p.suffix or ".json"
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "_", n).strip("_") or "run" for n in names]
    if len(set(safe)) < len(safe):
        safe = [f"{i}-{s}" for i, s in enumerate(safe)]
    return [p.with_name(f"{stem}.{s}{suffix}") for s in safe]


def write_chrome_traces(results: Mapping[str, RunResult], path: str | Path) -> list[Path]:
    """Write one trace per run (see :func:`per_run_paths`); returns the files."""
    written = []
    for (_name, r), p in zip(results.items(), per_run_paths(path, list(results)), strict=True):
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(chrome_trace(r), separators=(",", ":")) + "\n")
        except OSError as e:
            raise ConfigError(f"{p}: cannot write the Chrome trace ({e.strerror})") from e
        written.append(p)
    return written
