"""Admission/preemption pairs (Andes §4.3): each admitted request with the victims that make
room for it, built one at a time so the overhead-aware refiner can stop at the first pair
that does not pay for itself."""

from __future__ import annotations

from sloserve.engine.kv import KVCacheManager
from sloserve.policies.andes.estimate import WAITING, Estimate

Pair = tuple[int, list[int], int, int]
"""(admitted candidate, its victims, prefill tokens, KV blocks it needs)."""


class Packer:
    """Builds admission/preemption pairs one at a time: each chosen waiting or swapped
    request (best first) with the lowest-priority victims that barely make room for it
    (KV blocks and an R_max slot). A (re)fill that does not fit this iteration's C / P
    budget is skipped without evicting anyone."""

    def __init__(
        self,
        kv: KVCacheManager,
        est: Estimate,
        admits: list[int],
        pool: list[int],
        *,
        avail: int,
        slots: int,
        budget_c: int,
        budget_p: int,
    ) -> None:
        self.kv = kv
        self.est = est
        self.admits = admits
        self.pos = 0
        self.pool = pool
        self.avail = avail
        self.slots = slots
        self.budget_c = budget_c
        self.budget_p = budget_p

    def next(self) -> Pair | None:
        kv = self.kv
        reqs = self.est.reqs
        kind = self.est.kind
        pool = self.pool
        while self.pos < len(self.admits):
            a = self.admits[self.pos]
            self.pos += 1
            r = reqs[a]
            if kind[a] == WAITING:
                tok = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
                if tok > self.budget_c or tok > self.budget_p:
                    continue
                need = kv.blocks_needed(r.req_id, tok)
            else:
                if self.budget_c < 1:
                    continue
                tok = 0
                need = max(kv.swap_in_blocks_needed(r.req_id), int(self.est.blocks[a]))
            vict: list[int] = []
            f, s = self.avail, self.slots
            while (f < need or s < 1) and pool:
                v = pool.pop(0)
                vict.append(v)
                f += kv.num_request_blocks(reqs[v].req_id)
                s += 1
            if f < need or s < 1:
                pool[0:0] = vict
                continue
            self.avail, self.slots = f - need, s - 1
            self.budget_c -= tok if kind[a] == WAITING else 1
            self.budget_p -= tok
            return a, vict, tok, need
        return None

    def cancel(self, pairs: list[Pair]) -> None:
        """Give the victims of cancelled pairs back (they keep running)."""
        back = [v for _a, vict, _t, _n in pairs for v in vict]
        self.pool[0:0] = back
