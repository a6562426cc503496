"""The linear cost model's run pricing, as plain functions over floats.

:class:`~sloserve.costmodel.linear.LinearCostModel` is an extension point (cost models
are subclassed), so its module stays Python; these loops of its
:meth:`~sloserve.costmodel.linear.LinearCostModel.run_until` are plain functions so that
the compiled build (``SLOSERVE_COMPILE=1``, ``setup.py``'s list) compiles them. They do
the method's floating-point operations in the method's order, one float at a time, so a
run priced here is bit-identical to the same iterations priced by
:meth:`~sloserve.costmodel.linear.LinearCostModel.batch_time` one by one (compiled, each
is one IEEE double operation, as in the interpreter; the build turns off the C
compiler's contraction of a multiply and an add into one fused operation).
"""

from __future__ import annotations

import math

_INF = math.inf


def decode_run(
    base: float,
    dec: float,
    kv: float,
    ctx: int,
    nd: int,
    now: float,
    t_next: float,
    limit: int,
) -> tuple[list[float], list[float]]:
    """Durations and end times of at most ``limit`` iterations of a decode-only batch
    (``nd`` decodes reading ``ctx`` KV tokens at the first, ``nd`` more at each next) from
    ``now``, stopping at the first that ends at or after ``t_next``: each iteration costs
    ``base + (dec + kv * ctx)``."""
    durs: list[float] = []
    ends: list[float] = []
    end = now
    # No event: a NaN bound never stops it (one test per step, not two).
    stop = t_next if t_next != _INF else math.nan
    for _ in range(limit):
        t = base + (dec + kv * float(ctx))
        ctx += nd
        end = end + t
        durs.append(t)
        ends.append(end)
        if end >= stop:
            break
    return durs, ends


def mixed_run(
    base: float,
    dec: float,
    kv: float,
    ctx: int,
    nd: int,
    pre: float,
    pw: float,
    work: int,
    work_step: int,
    now: float,
    t_next: float,
    limit: int,
) -> tuple[list[float], list[float]]:
    """:func:`decode_run` for a batch with prefill chunks (and perhaps no decodes): each
    iteration adds ``pre + pw * work`` after the decode term, ``work`` growing by
    ``work_step`` an iteration."""
    durs: list[float] = []
    ends: list[float] = []
    end = now
    for _ in range(limit):
        t = base
        if nd:
            t = t + (dec + kv * float(ctx))
            ctx += nd
        t = t + (pre + pw * float(work))
        work += work_step
        end = end + t
        durs.append(t)
        ends.append(end)
        if end >= t_next and t_next != _INF:  # (no event: all ``limit`` of them)
            break
    return durs, ends
