"""Validation of a policy's output against the instance's limits, before anything changes.

The engine trusts no policy: every :class:`SchedulerOutput` is checked for evictions of
requests that are not running here, requests scheduled twice or in the wrong state, token
counts outside 1..remaining, the token budgets C and P, R_max, and the KV memory M and the
CPU swap tier it would need. A violation raises
:class:`~sloserve.core.errors.SchedulerViolation` naming the policy and the limit, and
leaves the instance untouched.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from sloserve.core.request import RequestStatus
from sloserve.engine.continuation import Continuation
from sloserve.engine.interface import PreemptionMode, ScheduledRequest, SchedulerOutput
from sloserve.engine.kv import KVOp

if TYPE_CHECKING:
    from sloserve.engine.instance import Instance

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED_RECOMPUTE)


_NONE: frozenset[int] = frozenset()


def check_evictions(
    inst: Instance, out: SchedulerOutput
) -> tuple[AbstractSet[int], AbstractSet[int]]:
    """Validate ``preempt`` and ``swap_in``; returns their request ids."""
    if not out.preempt and not out.swap_in:
        return _NONE, _NONE  # (most steps: no sets built)
    me = inst.instance_id
    preempted: set[int] = set()
    for r, _mode in out.preempt:
        if r.status is not RequestStatus.RUNNING or r.instance_id != me:
            raise inst._violation(
                "preempt", f"request {r.req_id} is {r.status.name}, not RUNNING here"
            )
        if r.req_id in preempted:
            raise inst._violation("preempt", f"request {r.req_id} preempted twice")
        preempted.add(r.req_id)
    swapping: set[int] = set()
    for r in out.swap_in:
        if r.status is not RequestStatus.PREEMPTED_SWAPPED or r.instance_id != me:
            raise inst._violation(
                "swap_in", f"request {r.req_id} is {r.status.name}, not swapped here"
            )
        if r.req_id in swapping:
            raise inst._violation("swap_in", f"request {r.req_id} swapped in twice")
        swapping.add(r.req_id)
    return preempted, swapping


Split = tuple[list[int], int, list[ScheduledRequest]]
"""A checked batch's running one-token decodes (ids, in batch order), the sum of their
contexts, and every other entry in batch order: the instance then walks only the others."""


def check_batch(
    inst: Instance,
    out: SchedulerOutput,
    preempted: AbstractSet[int],
    swapping: AbstractSet[int],
    lead: Continuation | None = None,
) -> tuple[int, int, int, Split | None]:
    """Validate the batch against C, P, R_max and M; returns (tokens, prefill, admitted,
    split), ``split`` None when a swap-in or an exact-fit KV manager is involved.

    ``lead``: the instance's continuation when the batch starts with its entries (and the
    output evicts and swaps in nothing): those are running one-token decodes already
    checked (:mod:`.continuation`), so only the entries after them are walked, and
    checked against repeating one of them.

    Runs before anything is mutated, so a violation leaves the instance untouched.
    """
    lim = inst.limits
    me = inst.instance_id
    RUNNING = RequestStatus.RUNNING
    seen: set[int] = set()
    tokens = prefill = admitted = 0
    # M is counted in this same pass (one walk of the batch per single step, not two); it
    # is judged only after C, P and R_max, so the first violation named stays the same.
    kv = inst.kv
    count_blocks = not kv.exact_fit
    bs = inst.limits.block_size
    blocks_needed = kv.blocks_needed
    decode_ids: list[int] = []
    others: list[ScheduledRequest] = []
    ctx = 0
    split = count_blocks and not swapping
    need = 0
    scheduled_swaps: set[int] = set()
    entries = out.batch
    lead_ids: set[int] | None = None
    if lead is not None:
        # Checked running decodes (no block counted for them yet, as for any decode).
        entries = entries[len(lead.entries) :]
        tokens = len(lead.entries)
        decode_ids = [*lead.ids]
        ctx = lead.ctx
    for entry in entries:
        r, n = entry
        rid = r.req_id
        if rid in seen:
            raise inst._violation("batch", f"request {rid} appears twice")
        seen.add(rid)
        st = r.status
        if r.instance_id != me:
            raise inst._violation("batch", f"request {rid} belongs to another instance")
        if st is RUNNING:
            if rid in preempted:
                raise inst._violation("batch", f"request {rid} is both preempted and scheduled")
            if lead is not None:  # (only a running request can repeat a checked one)
                if lead_ids is None:
                    lead_ids = set(lead.ids)
                if rid in lead_ids:
                    raise inst._violation("batch", f"request {rid} appears twice")
        elif st in _QUEUED:
            admitted += 1
        elif st is RequestStatus.PREEMPTED_SWAPPED:
            if rid not in swapping:
                raise inst._violation("batch", f"request {rid} is swapped out and not swapped in")
        else:
            raise inst._violation("batch", f"request {rid} is {st.name}")
        n_out = r.num_output_tokens
        remaining = r.num_prompt_tokens + n_out - r.num_computed_tokens
        if n < 1 or n > remaining:
            raise inst._violation(
                "batch", f"request {rid} given {n} tokens, must be 1..{remaining}"
            )
        tokens += n
        if n_out == 0 or remaining > 1:
            prefill += n
        if count_blocks:  # (blocks_needed changes nothing: safe before a later violation)
            if swapping and rid in swapping:
                scheduled_swaps.add(rid)
                need += -(-(r.num_computed_tokens + n) // bs)
            elif n == 1 and n_out and remaining == 1:
                decode_ids.append(rid)
                ctx += r.num_computed_tokens
                if st is not RUNNING:
                    split = False  # (not seen: a queued request is never one token short)
            else:
                need += blocks_needed(rid, n)
                others.append(entry)
    if tokens > lim.max_batch_tokens:
        raise inst._violation("C (max batch tokens)", f"{tokens} tokens > C={lim.max_batch_tokens}")
    if prefill > lim.max_prefill_tokens:
        raise inst._violation(
            "P (max prefill tokens)", f"{prefill} prefill tokens > P={lim.max_prefill_tokens}"
        )
    running_after = len(inst.running) - len(preempted) + len(swapping) + admitted
    if running_after > lim.max_running:
        raise inst._violation(
            "R_max (max running)", f"{running_after} running > R_max={lim.max_running}"
        )
    check_memory(inst, out, need, decode_ids, scheduled_swaps)
    return tokens, prefill, admitted, ((decode_ids, ctx, others) if split else None)


def check_memory(
    inst: Instance,
    out: SchedulerOutput,
    need: int,
    decode_ids: list[int],
    scheduled_swaps: set[int],
) -> None:
    """M and the CPU tier: everything the output allocates must fit, before any change.

    ``need``: the blocks the batch's prefills and swapped-in entries need, ``decode_ids``
    its one-token decodes, ``scheduled_swaps`` its swapped-in entries (counted by
    :func:`check_batch`'s pass; unused by an exact-fit manager, which dry-runs instead)."""
    kv = inst.kv
    if kv.exact_fit:
        # Order-exact, CPU tier included (a block count would misjudge shared blocks,
        # and BROS's CPU tier holds slots, not whole blocks).
        err = kv.dry_run(kv_ops(out))
        if err is not None:
            limit = "CPU swap capacity" if "CPU" in err else "M (KV capacity)"
            raise inst._violation(limit, f"the batch does not fit: {err}")
        return
    freed = 0
    if out.preempt:  # (most single steps evict nothing: no generators built for them)
        freed = sum(kv.num_request_blocks(r.req_id) for r, _m in out.preempt)
        to_cpu = sum(
            kv.num_request_blocks(r.req_id) for r, m in out.preempt if m is PreemptionMode.SWAP
        )
        cpu = getattr(kv, "cpu", None)
        if to_cpu and (cpu is None or to_cpu > cpu.free_blocks):
            raise inst._violation(
                "CPU swap capacity",
                f"{to_cpu} blocks to swap out, {cpu.free_blocks if cpu else 0} free on the CPU",
            )
    if out.swap_in:
        need += sum(
            kv.swap_in_blocks_needed(r.req_id)
            for r in out.swap_in
            if r.req_id not in scheduled_swaps
        )
    free = kv.num_free_blocks + freed
    if need + len(decode_ids) <= free:
        return  # a decode needs at most one block (decode_blocks_needed): no need to count
    need += kv.decode_blocks_needed(decode_ids)
    if need > free:
        raise inst._violation(
            "M (KV capacity)", f"the batch needs {need} KV blocks, {free} would be free"
        )


def kv_ops(out: SchedulerOutput) -> list[KVOp]:
    """The KV operations of ``out`` in the order :meth:`Instance._apply` performs them."""
    ops: list[KVOp] = [
        ("swap_out" if m is PreemptionMode.SWAP else "free", r.req_id, 0) for r, m in out.preempt
    ]
    ops.extend(("swap_in", r.req_id, 0) for r in out.swap_in)
    decodes: list[KVOp] = []
    for r, n in out.batch:
        if r.num_output_tokens and r.remaining_compute == 1:
            decodes.append(("grow", r.req_id, 1))
        else:
            ops.append(("grow", r.req_id, n))
    ops.extend(decodes)
    return ops
