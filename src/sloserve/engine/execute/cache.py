"""The real KV cache of execute mode, laid out by the engine's own KV manager.

One pair of device tensors ``[layers, slots, kv_heads, head_dim]`` holds every key and
value; slot ``s`` is block ``s // block_size``, offset ``s % block_size`` of the manager's
blocks (:meth:`~sloserve.engine.kv.KVCacheManager.slot_runs`), so the manager's allocation
*is* the cache layout. The cache keeps, per request, which slot holds the KV of each token
position (``-1``: not on the device) and a host copy of positions that left the device.

Each iteration :meth:`PagedKVCache.sync` reconciles that map with the manager, after the
instance applied the iteration and before anything is written:

1. Positions whose slot the request no longer owns are copied to host memory if the
   request still needs them (swapped out, or BROS' lazy checkpoint of BE slots an RT
   request takes over) and dropped otherwise (recompute preemption, finish, abort). All
   copies out happen before any copy in, so a slot freed and reused in one iteration is
   read before it is overwritten.
2. Slots a request owns but the map does not use receive, in order, its host-side
   positions (swap in, BROS restore) and then the positions this iteration computes.

For a paged manager this keeps token ``i`` in the ``i``-th listed slot, exactly vLLM's
block table; BROS' bidirectional blocks place a restored position wherever the manager
found room, as the paper allows. Host copies are pinned when the cache is on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloserve.core.errors import SloserveError
from sloserve.core.request import Request, RequestStatus
from sloserve.engine.kv import KVCacheManager

_KEEP = (RequestStatus.RUNNING, RequestStatus.PREEMPTED_SWAPPED)
"""States in which a request's KV must survive losing its device slots."""


class ExecutionError(SloserveError):
    """The real cache and the engine's KV manager disagree (a bug, never a user error)."""


@dataclass
class _Seq:
    req: Request
    slots: list[int] = field(default_factory=list)
    """Slot of each token position (-1: not on the device)."""
    runs: list[tuple[int, int]] = field(default_factory=list)
    """The manager's runs at the last sync (unchanged runs skip the reconciliation)."""
    host: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    """Position -> (K, V) ``[layers, kv_heads, head_dim]`` on the host."""


def _expand(runs: list[tuple[int, int]]) -> list[int]:
    out: list[int] = []
    for start, n in runs:
        out.extend(range(start, start + n))
    return out


def _grown(old: list[tuple[int, int]], new: list[tuple[int, int]]) -> list[int] | None:
    """The slots ``new`` adds when it only extends ``old`` (same runs, the last one longer,
    more after it); None when the change is anything else."""
    k = len(old)
    if not k or len(new) < k or new[: k - 1] != old[: k - 1]:
        return None
    (s0, n0), (s1, n1) = old[-1], new[k - 1]
    if s0 != s1 or n1 < n0:
        return None
    return list(range(s1 + n0, s1 + n1)) + _expand(new[k:])


class PagedKVCache:
    """Device KV tensors addressed by the KV manager's slots (module docstring)."""

    def __init__(
        self,
        torch: Any,
        num_slots: int,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        device: Any,
        dtype: Any,
    ) -> None:
        self.torch = torch
        self.device = device
        shape = (num_layers, num_slots, kv_heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.num_slots = num_slots
        self.pin = device.type == "cuda"
        self.seqs: dict[int, _Seq] = {}
        self.transferred_tokens = 0
        """Positions copied device -> host or host -> device, over the whole run."""

    def track(self, req: Request) -> None:
        """Start (or restart, after a recompute preemption) following ``req``."""
        seq = self.seqs.get(req.req_id)
        if seq is None or seq.req is not req or req.num_computed_tokens == 0:
            self.seqs[req.req_id] = _Seq(req)

    def slots_of(self, req_id: int, stop: int) -> list[int]:
        """Device slots of positions ``0 .. stop-1`` (all on the device after a sync)."""
        return self.seqs[req_id].slots[:stop]

    def sync(self, kv: KVCacheManager, need: dict[int, int]) -> None:
        """Reconcile with ``kv``; ``need[req] = n`` positions it must hold on the device."""
        torch = self.torch
        owned: dict[int, list[int]] = {}
        grown_ids: set[int] = set()
        for rid, seq in list(self.seqs.items()):
            if seq.req.status not in _KEEP and rid not in need:
                del self.seqs[rid]  # ended or will recompute: its KV is garbage now
                continue
            runs = kv.slot_runs(rid)
            if runs == seq.runs and rid not in need:
                continue
            grown = _grown(seq.runs, runs) if not seq.host else None
            if grown is not None:  # the common case: the last block filled up, more added
                seq.runs = runs
                owned[rid] = grown
                grown_ids.add(rid)
                continue
            own = _expand(runs)
            owned[rid] = own
            mine = set(own)
            lost = [p for p, s in enumerate(seq.slots) if s >= 0 and s not in mine]
            if lost:
                idx = torch.tensor([seq.slots[p] for p in lost], device=self.device)
                k, v = self.k[:, idx].cpu(), self.v[:, idx].cpu()
                if self.pin:
                    k, v = k.pin_memory(), v.pin_memory()
                for j, p in enumerate(lost):
                    seq.host[p] = (k[:, j], v[:, j])
                    seq.slots[p] = -1
                self.transferred_tokens += len(lost)
            seq.runs = runs
        for rid, own in owned.items():
            seq = self.seqs[rid]
            if rid in grown_ids:
                free = own
            else:
                used = {s for s in seq.slots if s >= 0}
                free = [s for s in own if s not in used]
            have = len(seq.slots)
            want = need.get(rid, have)
            if have < want:
                seq.slots.extend([-1] * (want - have))
            if rid in grown_ids:
                todo = list(range(have, want))
            else:
                todo = sorted(seq.host)
                todo += [p for p in range(want) if seq.slots[p] < 0 and p not in seq.host]
            if len(todo) > len(free) and rid not in need:
                todo = todo[: len(free)]  # not running now: the rest stays on the host
            if len(todo) > len(free):
                raise ExecutionError(
                    f"request {rid}: {len(todo)} positions to place, {len(free)} free slots"
                )
            restore = [(p, free[i]) for i, p in enumerate(todo) if p in seq.host]
            for i, p in enumerate(todo):
                seq.slots[p] = free[i]
            if restore:
                dst = torch.tensor([s for _p, s in restore], device=self.device)
                ks = torch.stack([seq.host[p][0] for p, _s in restore], dim=1)
                vs = torch.stack([seq.host[p][1] for p, _s in restore], dim=1)
                self.k[:, dst] = ks.to(self.device, non_blocking=True)
                self.v[:, dst] = vs.to(self.device, non_blocking=True)
                for p, _s in restore:
                    del seq.host[p]
                self.transferred_tokens += len(restore)
        for rid, n in need.items():
            slots = self.seqs[rid].slots
            if len(slots) < n or min(slots[:n], default=0) < 0:
                raise ExecutionError(f"request {rid}: positions missing from the device cache")

    def prune(self) -> None:
        """Forget requests that ended or lost their KV (a sync does this too)."""
        for rid in [rid for rid, s in self.seqs.items() if s.req.status not in _KEEP]:
            del self.seqs[rid]

    def check_empty(self) -> None:
        """Raise unless no live request holds device slots (every request ended)."""
        self.prune()
        held = [rid for rid, s in self.seqs.items() if any(x >= 0 for x in s.slots)]
        if held:
            raise ExecutionError(f"requests {held} still hold device KV")

    @staticmethod
    def slot_array(slots: list[int]) -> np.ndarray:
        return np.asarray(slots, dtype=np.int64)
