"""The invariants of BROS' bidirectional KV blocks, checked in one place.

:meth:`BidirectionalKVManager.check_invariants` calls :func:`check_bidirectional` (tests
and ``--check-invariants`` runs; never on the simulator's hot path). What it checks is
listed in :mod:`~sloserve.engine.kv_bidirectional`'s docstring: no slot owned twice,
owners and counts agree, the free list and the one-sided indexes are exact, no KV lost,
and the CPU tier's counters equal what it holds.
"""

from __future__ import annotations

from sloserve.engine.kv import KVInvariantError
from sloserve.engine.kv_bidirectional import _NONE, BidirectionalKVManager


def check_bidirectional(m: BidirectionalKVManager) -> None:
    """Raise :class:`KVInvariantError` naming the first broken invariant of ``m``."""
    bs = m.block_size
    gpu: dict[int, int] = {}
    for b in range(m.num_blocks):
        left, right, lc, rc = m.left[b], m.right[b], m.lcount[b], m.rcount[b]
        if lc < 0 or rc < 0 or lc + rc > bs:
            raise KVInvariantError(f"block {b}: {lc} RT + {rc} BE slots > {bs} (slot owned twice)")
        if (left == _NONE) != (lc == 0) or (right == _NONE) != (rc == 0):
            raise KVInvariantError(f"block {b}: owners {left}/{right} with counts {lc}/{rc}")
        ownerless = left == _NONE and right == _NONE
        if ownerless != m._free_set[b]:
            raise KVInvariantError(f"block {b}: free flag disagrees with its owners")
        if left != _NONE and right == _NONE and b not in m._rt_only[bs - lc]:
            raise KVInvariantError(f"block {b}: missing from the RT-only index")
        if right != _NONE and left == _NONE and b not in m._be_only[bs - rc]:
            raise KVInvariantError(f"block {b}: missing from the BE-only index")
        for owner, count in ((left, lc), (right, rc)):
            if owner != _NONE:
                if b not in m._tables.get(owner, ()):
                    raise KVInvariantError(f"block {b}: not in request {owner}'s table")
                gpu[owner] = gpu.get(owner, 0) + count
    if m._be_only_slots != sum(
        bs - e for e, d in enumerate(m._be_only) for _b in d
    ) or m._rt_only_empty != sum(e for e, d in enumerate(m._rt_only) for _b in d):
        raise KVInvariantError("the one-sided blocks' slot totals are stale")
    if len(m._free) != len(set(m._free)) or sorted(m._free) != [
        b for b in range(m.num_blocks) if m._free_set[b]
    ]:
        raise KVInvariantError("the free list disagrees with the ownerless blocks")
    if sum(len(d) for d in m._be_only) + sum(len(d) for d in m._rt_only) != sum(
        1 for b in range(m.num_blocks) if (m.left[b] == _NONE) != (m.right[b] == _NONE)
    ):
        raise KVInvariantError("stale entries in the one-sided block indexes")
    own: dict[int, int] = {}
    for b in range(m.num_blocks):
        empty = bs - m.lcount[b] - m.rcount[b]
        for owner in (m.left[b], m.right[b]):
            if owner != _NONE and empty:
                own[owner] = own.get(owner, 0) + empty
    if {r: e for r, e in m._own_empty.items() if e} != own:
        raise KVInvariantError("the per-request empty-slot counts are stale")
    for rid, table in m._tables.items():
        rt = m._is_rt.get(rid, True)
        side = m.left if rt else m.right
        if len(set(table)) != len(table) or any(side[b] != rid for b in table):
            raise KVInvariantError(f"request {rid}: block table {table} disagrees with owners")
    for rid, tokens in m._tokens.items():
        if gpu.get(rid, 0) + m._ckpt.get(rid, 0) != tokens:
            raise KVInvariantError(
                f"request {rid}: {tokens} tokens but {gpu.get(rid, 0)} on the GPU and "
                f"{m._ckpt.get(rid, 0)} checkpointed (KV lost)"
            )
    if set(gpu) - set(m._tokens):
        raise KVInvariantError(f"requests {sorted(set(gpu) - set(m._tokens))} untracked")
    if m._swapped.keys() & (m._tokens.keys() | m._tables.keys()):
        raise KVInvariantError("a request is both swapped out and on the GPU")
    cpu = sum(m._ckpt.values()) + sum(m._swapped.values())
    if cpu != m._cpu_slots or cpu > m.cpu.capacity_blocks * bs:
        raise KVInvariantError(f"CPU tier holds {cpu} slots, counter says {m._cpu_slots}")
    if m.cpu.used_blocks != -(-cpu // bs):
        raise KVInvariantError("the CPU tier's block counter is stale")
    index = {(r, b) for r, blocks in m._pt_blocks.items() for b in blocks}
    if index != {(r, b) for b, p in m.preemption_table.items() for r in p}:
        raise KVInvariantError("the preemption table's index is stale")
    for b, (rt_id, be_id) in m.preemption_table.items():
        if m.left[b] != rt_id or be_id not in m._ckpt:
            raise KVInvariantError(f"preemption table entry {b}: {(rt_id, be_id)} is stale")
