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
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from sloserve.core.request import QoESpec, Request, RequestStatus
from sloserve.metrics.qoe import andes_qoe, delivered_qoe
from sloserve.metrics.run_summary import summarize_columns

if TYPE_CHECKING:  # pandas is imported where a table is built: --json runs never need it
    import pandas as pd


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


COLUMNS = (
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
"""The columns of :func:`request_table`, in order."""


def _joined_logs(
    iter_ends: Mapping[int, NDArray[np.float64]],
) -> tuple[NDArray[np.float64], dict[int, int]]:
    """Every instance's iteration log end to end, and where each instance's log starts."""
    logs = [np.asarray(e, dtype=np.float64) for e in iter_ends.values()]
    offset: dict[int, int] = {}
    pos = 0
    for i, e in zip(iter_ends, logs, strict=True):
        offset[i] = pos
        pos += e.size
    return (np.concatenate(logs) if logs else np.empty(0)), offset


def _timelines(
    requests: Sequence[Request], log: NDArray[np.float64], offset: Mapping[int, int]
) -> tuple[
    NDArray[np.float64],
    list[int],
    list[int],
    NDArray[np.float64],
    NDArray[np.float64],
    NDArray[np.float64],
]:
    """Token times of every request served on one replica (no failover), all at once.

    Returns the concatenated token times, each request's start in them and token count
    (0 for requests this does not cover: no token, or a failover's client timeline), and
    per request its TTFT, TPOT and longest gap (NaN when undefined). The same numbers as
    :func:`token_times` per request: the same log entries, differences and divisions.
    """
    nan = float("nan")
    m = len(requests)
    flat: list[int] = []
    nruns: list[int] = []
    offs: list[int] = []
    who: list[int] = []
    for k, r in enumerate(requests):
        runs = r.token_runs
        if runs and not r.streamed_times:
            flat.extend(runs)
            nruns.append(len(runs) // 2)
            offs.append(offset[r.instance_id])
            who.append(k)
    if not who:
        none = np.full(m, nan)
        return np.empty(0), [0] * m, [0] * m, none, none.copy(), none.copy()
    ab = (
        np.asarray(flat, dtype=np.int64).reshape(-1, 2)
        + np.repeat(np.asarray(offs, dtype=np.int64), nruns)[:, None]
    )
    lens = ab[:, 1] - ab[:, 0] + 1
    run_pos = np.cumsum(lens) - lens  # where each run starts in the concatenation
    times = log[np.arange(int(lens.sum())) + np.repeat(ab[:, 0] - run_pos, lens)]
    first_run = np.cumsum(nruns) - np.asarray(nruns)
    n = np.add.reduceat(lens, first_run)
    s = np.cumsum(n) - n
    last = s + n - 1
    arrival = np.asarray([requests[k].arrival for k in who], dtype=np.float64)
    t_ttft = times[s] - arrival
    multi = n > 1
    t_tpot = np.full(len(who), nan)
    t_tpot[multi] = (times[last[multi]] - times[s[multi]]) / (n[multi] - 1)
    t_gap = np.full(len(who), nan)
    if multi.any():
        # Max of the diffs inside each request's segment: reduceat over (start, end) pairs;
        # the padding keeps the last end index in range.
        diffs = np.empty(times.size)
        np.subtract(times[1:], times[:-1], out=diffs[:-1])  # np.diff, one slot longer
        diffs[-1] = 0.0
        bounds = np.stack((s[multi], last[multi]), axis=1).ravel()
        t_gap[multi] = np.maximum.reduceat(diffs, bounds)[::2]
    at = np.asarray(who, dtype=np.int64)
    a_start = np.zeros(m, dtype=np.int64)
    a_count = np.zeros(m, dtype=np.int64)
    a_start[at], a_count[at] = s, n
    a_ttft, a_tpot, a_gap = np.full(m, nan), np.full(m, nan), np.full(m, nan)
    a_ttft[at], a_tpot[at], a_gap[at] = t_ttft, t_tpot, t_gap
    return times, a_start.tolist(), a_count.tolist(), a_ttft, a_tpot, a_gap


def request_table(
    requests: Sequence[Request], iter_ends: Mapping[int, NDArray[np.float64]]
) -> pd.DataFrame:
    """One row per request with its timeline metrics and SLO outcomes (the columns of
    :func:`request_columns` as a DataFrame)."""
    return table_of(request_columns(requests, iter_ends))


def table_of(cols: Mapping[str, Sequence[Any]]) -> pd.DataFrame:
    """The request table of :func:`request_columns`' columns (``COLUMNS`` first, in order,
    then any a caller added)."""
    import pandas as pd

    return pd.DataFrame(cols, columns=list(cols))


def request_columns(
    requests: Sequence[Request], iter_ends: Mapping[int, NDArray[np.float64]]
) -> dict[str, list[Any]]:
    """:func:`request_table`'s columns (name -> one value per request, ``COLUMNS`` order).

    Built column by column; the token timelines of requests served on one replica are
    gathered at once (:func:`_timelines`), failovers' client timelines one by one.
    """
    if not requests:
        return {c: [] for c in COLUMNS}
    nan = float("nan")
    log, offset = _joined_logs(iter_ends)
    derived: dict[str, list[float]] = {k: [] for k in _DERIVED}
    # In chunks: the gathered token times of a chunk are the only per-token arrays alive.
    for lo in range(0, len(requests), _CHUNK):
        part = _chunk_columns(requests[lo : lo + _CHUNK], log, offset, iter_ends)
        for k, v in part.items():
            derived[k].extend(v)
    # The plain columns, one comprehension each (faster than appending row by row).
    status_name = {s: s.name.lower() for s in RequestStatus}
    slos = [r.slo for r in requests]
    qspecs = [r.qoe for r in requests]
    cols: dict[str, list[Any]] = {
        "req_id": [r.req_id for r in requests],
        "instance": [r.instance_id for r in requests],
        "class": [r.req_class.value for r in requests],
        "priority": [r.priority for r in requests],
        "model": [r.model for r in requests],
        "status": [status_name[r.status] for r in requests],
        "arrival_s": [r.arrival for r in requests],
        "prompt_tokens": [r.num_prompt_tokens for r in requests],
        "output_tokens": [r.true_output_len for r in requests],
        "generated_tokens": [r.num_output_tokens for r in requests],
        "queue_s": [
            (r.first_scheduled - r.arrival) if r.first_scheduled is not None else nan
            for r in requests
        ],
        "ttft_s": derived["ttft_s"],
        "tpot_s": derived["tpot_s"],
        "atgt_s": list(derived["tpot_s"]),
        "max_gap_s": derived["max_gap_s"],
        "e2e_s": derived["e2e_s"],
        "normalized_latency_s": derived["normalized_latency_s"],
        "finish_s": [r.finish_time if r.finish_time is not None else nan for r in requests],
        "qoe": derived["qoe"],
        "preemptions": [r.num_preemptions for r in requests],
        "swaps": [r.num_swaps for r in requests],
        "slo_ttft_s": [x.ttft_s if x.ttft_s is not None else nan for x in slos],
        "slo_tpot_s": [x.tpot_s if x.tpot_s is not None else nan for x in slos],
        "slo_deadline_s": [x.deadline_s if x.deadline_s is not None else nan for x in slos],
        "qoe_ttft_s": [q.ttft_s if q is not None else nan for q in qspecs],
        "qoe_tokens_per_s": [q.tokens_per_s if q is not None else nan for q in qspecs],
        "ttft_ok": derived["ttft_ok"],
        "tpot_ok": derived["tpot_ok"],
        "deadline_ok": derived["deadline_ok"],
        "slo_ok": derived["slo_ok"],
        "reject_reason": [r.reject_reason for r in requests],
    }
    return cols


_DERIVED = (
    "ttft_s",
    "tpot_s",
    "max_gap_s",
    "e2e_s",
    "normalized_latency_s",
    "qoe",
    "ttft_ok",
    "tpot_ok",
    "deadline_ok",
    "slo_ok",
)


def _chunk_columns(
    chunk: Sequence[Request],
    log: NDArray[np.float64],
    offset: Mapping[int, int],
    iter_ends: Mapping[int, NDArray[np.float64]],
) -> dict[str, list[float]]:
    """The timeline and SLO columns of some requests, column by column: the same values,
    operations and order as one request at a time (IEEE float64 either way), with what is
    rare (a failover's client timeline, an in-flight QoE) still done one by one."""
    nan = float("nan")
    FINISHED = RequestStatus.FINISHED
    REJECTED = RequestStatus.REJECTED
    times, starts, counts, ttfts, tpots, gaps = _timelines(chunk, log, offset)
    ttft = np.asarray(ttfts, dtype=np.float64)
    tpot = np.asarray(tpots, dtype=np.float64)
    gap = np.asarray(gaps, dtype=np.float64)
    ntok = np.asarray(counts, dtype=np.int64)
    gathered = ntok > 0  # (ntok changes below: the requests done one by one)
    own: dict[int, NDArray[np.float64]] = {}  # token times of the requests done one by one
    for k in np.flatnonzero(ntok == 0).tolist():
        r = chunk[k]
        t = token_times(r, iter_ends[r.instance_id]) if r.streamed_times else _EMPTY
        own[k] = t
        n = t.size
        ntok[k] = n
        ttft[k] = float(t[0]) - r.arrival if n else nan
        tpot[k] = (float(t[-1]) - float(t[0])) / (n - 1) if n > 1 else nan
        gap[k] = float(np.max(np.diff(t))) if n > 1 else nan
    status = [r.status for r in chunk]
    finished = np.asarray([st is FINISHED for st in status], dtype=bool)
    arrival = np.asarray([r.arrival for r in chunk], dtype=np.float64)
    qspecs = [r.qoe for r in chunk]
    # The finished requests with a QoE spec whose tokens _timelines gathered: all at once.
    at_once = gathered & finished & np.asarray([q is not None for q in qspecs], dtype=bool)
    qoes = _delivered_qoes(chunk, qspecs, at_once, times, starts, counts, arrival)
    finish = np.asarray(
        [r.finish_time if r.finish_time is not None else nan for r in chunk], dtype=np.float64
    )
    e2e = np.where(finished, finish - arrival, nan)  # NaN: never finished, or no finish time
    norm = np.full(len(chunk), nan)
    out_len = np.asarray([r.true_output_len for r in chunk], dtype=np.int64)
    norm[finished] = e2e[finished] / out_len[finished]

    def qoe(k: int, r: Request) -> float:
        rq = r.qoe
        if rq is None:
            return nan
        if status[k] is REJECTED:
            return 0.0
        t = times[starts[k] : starts[k] + counts[k]] if counts[k] else own[k]
        if status[k] is FINISHED:
            return andes_qoe(r.arrival, t, rq.ttft_s, rq.tokens_per_s)
        if r.finish_time is not None:
            return andes_qoe(
                r.arrival,
                t,
                rq.ttft_s,
                rq.tokens_per_s,
                now=r.finish_time,
                total_tokens=r.true_output_len,
            )
        return nan

    qoe_col = qoes  # the rest one by one: rejected, in flight, no spec, a failover's
    for k in np.flatnonzero(~at_once).tolist():
        qoe_col[k] = qoe(k, chunk[k])
    slos = [r.slo for r in chunk]
    empty = np.asarray([x.empty for x in slos], dtype=bool)
    ttft_ok = _meets_all(slos, "ttft_s", ttft, finished | (ntok > 0))
    tpot_ok = _meets_all(slos, "tpot_s", np.where(ntok > 1, tpot, 0.0), finished)
    dl_ok = _meets_all(slos, "deadline_s", e2e, finished)
    met = ~((ttft_ok == 0.0) | (tpot_ok == 0.0) | (dl_ok == 0.0))  # NaN: no such target
    slo_ok = np.where(finished & met, 1.0, 0.0)
    for col in (ttft_ok, tpot_ok, dl_ok, slo_ok):
        col[empty] = nan
    return {
        "ttft_s": ttft.tolist(),
        "tpot_s": tpot.tolist(),
        "max_gap_s": gap.tolist(),
        "e2e_s": e2e.tolist(),
        "normalized_latency_s": norm.tolist(),
        "qoe": qoe_col.tolist(),
        "ttft_ok": ttft_ok.tolist(),
        "tpot_ok": tpot_ok.tolist(),
        "deadline_ok": dl_ok.tolist(),
        "slo_ok": slo_ok.tolist(),
    }


def _meets_all(
    slos: Sequence[Any], name: str, value: NDArray[np.float64], observed: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """:func:`_meets` of every request's target ``name``, at once."""
    target = np.asarray(
        [t if (t := getattr(x, name)) is not None else np.nan for x in slos], dtype=np.float64
    )
    ok = observed & (value <= target + 1e-12)  # False where value or target is NaN
    return np.where(np.isnan(target), np.nan, np.where(ok, 1.0, 0.0))


def _delivered_qoes(
    requests: Sequence[Request],
    qspecs: Sequence[QoESpec | None],
    at_once: NDArray[np.bool_],
    times: NDArray[np.float64],
    starts: Sequence[int],
    counts: Sequence[int],
    arrival: NDArray[np.float64],
) -> NDArray[np.float64]:
    """:func:`~sloserve.metrics.qoe.delivered_qoe` of the requests ``at_once`` marks
    (finished, with a QoE spec, their tokens gathered by :func:`_timelines`), by position
    (NaN elsewhere).

    Requests with the same number of tokens are done together as the rows of one 2-D
    array (:func:`_qoe_rows`): each step of ``delivered_qoe`` is then one numpy call for
    all of them, the running maximum runs along each row (a maximum rounds nothing) and
    each row's sums are numpy's pairwise sums over that row alone — a C-contiguous row
    reduced along the last axis is summed exactly as the same values in a 1-D array
    (checked bit for bit in ``tests/test_summary_qoe_rows.py``), so every float is the one
    ``delivered_qoe`` gives."""
    out = np.full(len(requests), np.nan)
    rows = np.flatnonzero(at_once)
    if not rows.size:
        return out
    specs = [q for q in (qspecs[k] for k in rows.tolist()) if q is not None]  # all of them
    target = np.asarray([q.ttft_s for q in specs], dtype=np.float64)
    spd = np.asarray([q.tokens_per_s for q in specs], dtype=np.float64)
    bad = np.flatnonzero(~(spd > 0) | ~(target >= 0))
    if bad.size:  # the first request's own error, as delivered_qoe raises it
        k = int(rows[bad[0]])
        delivered_qoe(float(arrival[k]), _EMPTY, float(target[bad[0]]), float(spd[bad[0]]))
    n = np.asarray(counts, dtype=np.int64)[rows]
    start = np.asarray(starts, dtype=np.int64)[rows]
    t1 = arrival[rows] + target
    whole = np.empty(rows.size)
    delay = np.empty(rows.size)
    order = np.argsort(n, kind="stable")  # rows of equal length next to each other
    n_sorted = n[order]
    cuts = np.flatnonzero(np.diff(n_sorted)) + 1
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), rows.size], strict=True):
        m = int(n_sorted[lo])
        step = max(1, _QOE_CHUNK * 256 // m)  # bounded temporaries: rows x m values each
        for a in range(lo, hi, step):
            idx = order[a : min(hi, a + step)]
            whole[idx], delay[idx] = _qoe_rows(times, start[idx], m, t1[idx], spd[idx])
    # min(1, max(0, 1 - S_delay / S_whole)), 1 where S_whole <= 0: numpy's minimum and
    # maximum pick as Python's min and max do on these (never NaN) values.
    pos = whole > 0
    q = np.ones(rows.size)
    q[pos] = np.minimum(1.0, np.maximum(0.0, 1.0 - delay[pos] / whole[pos]))
    out[rows] = q
    return out


def _qoe_rows(
    times: NDArray[np.float64],
    start: NDArray[np.int64],
    m: int,
    t1: NDArray[np.float64],
    speed: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``S_whole`` and ``S_delay`` of requests of ``m`` tokens each (their tokens at
    ``times[start:start + m]``), one request a row: :func:`~sloserve.metrics.qoe.
    delivered_qoe`'s operations, in its order, each in place where it can be."""
    x = times[start[:, None] + np.arange(m)]  # a fresh C-contiguous (rows, m) array
    st = np.arange(m, dtype=np.float64) / speed[:, None]  # (i-1)/s
    x -= st
    np.maximum(x[:, 0], t1, out=x[:, 0])
    np.maximum.accumulate(x, axis=1, out=x)
    x += st  # a: the consumption times
    ideal = np.add(t1[:, None], st, out=st)  # t1 + (i-1)/s
    whole = x[:, -1:] - ideal  # a[-1] - ideal
    x -= ideal  # a - ideal
    total = np.add.reduce  # along each row: pairwise, as ndarray.sum of that row alone
    return total(whole, axis=1), total(x, axis=1)


_QOE_CHUNK = 1024
"""With 256 tokens a request on average: the most token values (``_QOE_CHUNK * 256``) one
step of :func:`_delivered_qoes` holds in each of its temporaries."""
_EMPTY: NDArray[np.float64] = np.empty(0)
_CHUNK = 8192


def _meets(target: float | None, value: float, observed: bool) -> float:
    """1.0 met, 0.0 missed (or never observed), NaN when there is no such target."""
    if target is None:
        return float("nan")
    if not observed or value != value:
        return 0.0
    return 1.0 if value <= target + 1e-12 else 0.0


def summarize(
    table: pd.DataFrame,
    *,
    simulated_seconds: float,
    wall_seconds: float,
    policy: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-serialisable summary of a run (documented in the README), from its
    request table (:func:`~sloserve.metrics.run_summary.summarize_columns` of its columns)."""
    cols = {c: table[c].to_numpy() for c in table.columns}
    return summarize_columns(
        cols,
        simulated_seconds=simulated_seconds,
        wall_seconds=wall_seconds,
        policy=policy,
        extra=extra,
    )
