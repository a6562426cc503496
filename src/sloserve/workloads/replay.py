"""Replaying a trace: the replay options applied to its rows (:func:`apply_replay`), then
one :class:`~sloserve.core.request.Request` per row (:func:`requests_from_rows`).

Columnar: the rows kept are an index into the trace's columns and every option is a numpy
step over whole columns (the same operations, in the same order, as the DataFrame code this
replaces, so the same floats), which lets a ``sloserve`` CSV go from file to requests
without pandas; what stays per row is building each request.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from sloserve.core.bounds import MAX_SECONDS, Priority, bound_text, first_violation
from sloserve.core.errors import WorkloadError
from sloserve.core.request import SLO, QoESpec, Request, RequestClass
from sloserve.workloads.trace_table import TraceTable

if TYPE_CHECKING:
    from sloserve.workloads.spec import WorkloadSpec

Rows = dict[str, Any]
"""The rows to replay: ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (arrays) and,
when the trace has them, ``class`` and ``model`` (lists, as pandas' ``astype(str)``),
``priority`` and the SLO/QoE columns (float arrays), ``hash_ids`` (a list)."""

_FLOAT_COLUMNS = ("priority", "ttft_slo_s", "tpot_slo_s", "deadline_s", "qoe_ttft_s",
                  "qoe_tokens_per_s")  # fmt: skip
_CLASSES = {"rt": RequestClass.RT, "be": RequestClass.BE}
REQUEST_FIELDS = ("req_id", "arrival", "num_prompt_tokens", "true_output_len", "req_class",
                  "priority", "model", "slo", "qoe", "max_tokens", "hash_ids")  # fmt: skip
"""The first fields of :class:`~sloserve.core.request.Request`, in order: the replay builds
requests by position (``tests/test_replay_fields.py`` checks the order still holds)."""


def clip_lengths(
    prompts: NDArray[np.int64], outputs: NDArray[np.int64], cap: int | None
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Prompt and output lengths capped to ``cap`` tokens in all (the prompt first)."""
    if cap is None:
        return prompts, outputs
    prompts = np.minimum(prompts, cap - 1)
    return prompts, np.clip(outputs, 1, cap - prompts)


def apply_replay(
    table: TraceTable, spec: WorkloadSpec, rng: np.random.Generator, notes: list[str]
) -> Rows:
    """The trace rows to replay, with arrival times relative to the window start."""
    opts = spec.replay
    trace_arrival = table.numbers("arrival_s")
    n0 = trace_arrival.size
    end = opts.end_s
    if end is None and "duration_s" in spec.model_fields_set and spec.duration_s is not None:
        # duration_s is the run's arrival window, in replayed (sped-up) time
        end = opts.start_s + spec.duration_s * opts.speedup
    keep = trace_arrival >= opts.start_s
    if end is not None:
        keep &= trace_arrival < end
    idx = np.flatnonzero(keep)
    if idx.size < n0:
        notes.append(
            f"window [{opts.start_s}, {end if end is not None else 'end'}) s "
            f"keeps {idx.size} of {n0} requests"
        )
    arrival = (trace_arrival[idx] - opts.start_s) / opts.speedup
    if idx.size and float(arrival.max()) > MAX_SECONDS:
        raise WorkloadError(
            f"{spec.trace}: replayed {opts.speedup}× the trace spans "
            f"{float(arrival.max()):.6g} s; at most {MAX_SECONDS:g} s (raise speedup)"
        )
    if opts.speedup != 1.0:
        notes.append(f"replayed {opts.speedup}× faster")
    if opts.sample is not None and opts.sample < 1.0:
        sel = rng.random(idx.size) < opts.sample
        idx, arrival = idx[sel], arrival[sel]
        notes.append(f"sampled {opts.sample:.0%}: {idx.size} requests")
    prompt = table.numbers("prompt_tokens")[idx]
    output = table.numbers("output_tokens")[idx]
    if opts.max_context is not None:
        over = (prompt + output) > opts.max_context
        if over.any():
            if opts.cap == "drop":
                sel = ~over
                idx, arrival, prompt, output = idx[sel], arrival[sel], prompt[sel], output[sel]
                notes.append(
                    f"dropped {int(over.sum())} request(s) longer than {opts.max_context} tokens"
                )
            else:
                prompt, output = clip_lengths(prompt, output, opts.max_context)
                notes.append(f"clipped {int(over.sum())} request(s) to {opts.max_context} tokens")
    if spec.num_requests is not None and idx.size > spec.num_requests:
        k = spec.num_requests
        idx, arrival, prompt, output = idx[:k], arrival[:k], prompt[:k], output[:k]
        notes.append(f"first {spec.num_requests} requests kept")
    rows: Rows = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output}
    names = table.names
    if "class" in names:
        rows["class"] = _take(table.texts("class"), idx)
    if opts.class_from is not None:
        if opts.class_from not in names:
            raise WorkloadError(
                f"{spec.trace}: replay.class_from={opts.class_from!r}, "
                "but the trace has no such column"
            )
        labels = _take(table.texts(opts.class_from), idx)
        rows["class"] = [opts.class_map.get(v, opts.default_class).value for v in labels]
    if "model" in names:
        rows["model"] = _take(table.texts("model"), idx)
        if opts.model_map:
            rows["model"] = [opts.model_map.get(m, m) for m in rows["model"]]
    for col in _FLOAT_COLUMNS:
        if col in names:
            rows[col] = table.numbers(col).astype(np.float64)[idx]
    if "hash_ids" in names:
        rows["hash_ids"] = _take(table.objects("hash_ids"), idx)
    if idx.size == 0:
        raise WorkloadError(f"{spec.trace}: no request left to replay after the replay options")
    return rows


def _take(values: list[Any], idx: NDArray[np.intp]) -> list[Any]:
    return [values[i] for i in idx.tolist()]


def requests_from_rows(
    rows: Rows, spec: WorkloadSpec, speed_rng: np.random.Generator
) -> list[Request]:
    """One request per row: the trace's values where it has them, else the class rules
    (an empty cell reads as NaN: the rule applies); reading speeds drawn from ``speed_rng``."""
    rules = spec.rules()
    # Python lists, not numpy scalars: one Request per row is the hot loop of a replay.
    arrival = np.asarray(rows["arrival_s"], dtype=np.float64).tolist()
    prompt = [int(p) for p in rows["prompt_tokens"].tolist()]
    output = [int(o) for o in rows["output_tokens"].tolist()]
    n = len(arrival)
    if "class" in rows:
        raw = [v.strip().lower() if isinstance(v, str) else v for v in rows["class"]]
        bad = [i for i, v in enumerate(raw) if v not in _CLASSES]
        if bad:
            i = bad[0]
            raise WorkloadError(
                f"{spec.trace}: request {i}: class must be rt or be ({raw[i]!r}); "
                "map labels with replay.class_map"
            )
        classes = [_CLASSES[v] for v in raw]
    else:
        classes = [spec.replay.default_class] * n
    model = rows["model"] if "model" in rows else ["default"] * n
    prio = rows["priority"].tolist() if "priority" in rows else None
    no_col = [math.nan] * n  # a missing column reads as NaN: the default applies
    ttft_slo, tpot_slo, deadline, qoe_ttft, qoe_speed = (
        rows[k].tolist() if k in rows else no_col for k in _FLOAT_COLUMNS[1:]
    )
    speeds = spec.qoe.speeds(speed_rng, n).tolist()
    qoe = spec.qoe
    rule_ttft = list(map(qoe.ttft, prompt))
    hashes = rows["hash_ids"] if "hash_ids" in rows else [None] * n
    # Shared immutable SLO and QoE specs, one per distinct value, each validated where it
    # first occurs (the same error, at the same request, as building one per row).
    slos: dict[tuple[float | None, float | None, float | None], SLO] = {}
    qoes: dict[tuple[float, float], QoESpec] = {}
    # Without any SLO cell, a request's SLO is its class rule's.
    per_row_slo = any(
        k in rows and not np.isnan(rows[k]).all()
        for k in ("ttft_slo_s", "tpot_slo_s", "deadline_s")
    )
    # An empty cell reads as NaN (v != v): the class rule's value, or the drawn speed.
    # Per-row values column by column first (none of these steps can fail); what can fail
    # (the specs' and the request's own checks) stays in the loop, in its order.
    rule_of = [rules[c] for c in classes]
    # A priority that is no integer in range (±inf: int() would raise OverflowError) is
    # the error of its own row: the loop stops there, so an earlier row's error (an SLO
    # or QoE check) is still the one reported. Readers bound the column already; rows
    # built otherwise may not be.
    stop = n
    if prio is None:
        priority = [rule.priority for rule in rule_of]
    else:
        arr = np.asarray(prio, dtype=np.float64)
        wrong = first_violation(Priority, np.where(np.isnan(arr), 0.0, arr))
        if wrong is not None:
            stop = wrong
        priority = [
            rule.priority if p != p else int(p)
            for rule, p in zip(rule_of[:stop], prio[:stop], strict=True)
        ]
    if per_row_slo:
        keys = [
            (rule.ttft_s if a != a else a, rule.tpot_s if b != b else b,
             rule.deadline_s if d != d else d)
            for rule, a, b, d in zip(rule_of, ttft_slo, tpot_slo, deadline, strict=True)
        ]  # fmt: skip
    else:
        by_rule = {id(rule): (rule.ttft_s, rule.tpot_s, rule.deadline_s) for rule in rules.values()}
        keys = [by_rule[id(rule)] for rule in rule_of]
    q_ttft = [(r if q != q else q) or 0.0 for r, q in zip(rule_ttft, qoe_ttft, strict=True)]
    q_speed = [(s if q != q else q) or s for s, q in zip(speeds, qoe_speed, strict=True)]
    out: list[Request] = []
    append = out.append
    for i in range(stop):
        key = keys[i]
        qa, qb = q_ttft[i], q_speed[i]
        try:
            slo = slos.get(key)
            if slo is None:
                slo = slos[key] = SLO(*key)
            spec_q = qoes.get((qa, qb)) if qa else None  # 0.0 and -0.0: not shared
            if spec_q is None:
                spec_q = QoESpec(qa, qb)
                if qa:
                    qoes[qa, qb] = spec_q
            # By position (REQUEST_FIELDS: req_id, arrival, prompt and output tokens, class,
            # priority, model, slo, qoe, max_tokens, hash_ids): ≈ 0.5 µs a request less
            # than by keyword, the hot loop of a replay.
            append(
                Request(
                    i,
                    arrival[i],
                    prompt[i],
                    output[i],
                    classes[i],
                    priority[i],
                    model[i],
                    slo,
                    spec_q,
                    None,
                    hashes[i],
                )
            )
        except ValueError as e:
            raise WorkloadError(f"{spec.trace}: request {i}: {e}") from e
    if stop < n:
        raise WorkloadError(
            f"{spec.trace}: request {stop}: priority must be an integer "
            f"{bound_text(Priority)} ({prio[stop] if prio is not None else None})"
        )
    return out
