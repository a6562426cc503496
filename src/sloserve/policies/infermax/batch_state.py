"""What one call of InferMax's GetNextBatch has used up so far (:mod:`.unified`): the free
blocks, running count and blocks promised to filling requests (:class:`State`), the
victims it may evict, lowest-ranked first (:class:`Victims`), and the exact charge of the
whole decode groups it took on account (:func:`settle`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from sloserve.core.request import Request
from sloserve.engine.interface import InstanceView, PreemptionMode
from sloserve.engine.kv import KVCacheManager


def settle(
    unsettled: list[Sequence[Request]], st: State, in_batch: set[int], kv: KVCacheManager
) -> None:
    """Charge the whole decode groups taken so far their exact blocks (one each was
    charged) and add their ids to the batch's."""
    for g in unsettled:
        ids = [r.req_id for r in g]
        st.free_blocks += len(ids) - kv.decode_blocks_needed(ids)
        in_batch.update(ids)
    unsettled.clear()


class State:
    """What GetNextBatch has used up so far in this call (a plain slotted class: one is
    built per decision, and a dataclass's default factories cost more than its work)."""

    __slots__ = ("cpu_free", "free_blocks", "gone", "n_running", "preempt", "promised")

    def __init__(self, free_blocks: int, n_running: int, promised: dict[int, int]) -> None:
        self.free_blocks = free_blocks
        self.n_running = n_running
        self.promised = promised
        self.cpu_free = -1
        """Free blocks of the CPU tier, read at the first eviction (-1: not yet)."""
        self.preempt: list[tuple[Request, PreemptionMode]] = []
        self.gone: set[int] = set()


class Victims:
    """Running requests from the lowest rank up, sorted only if an eviction is needed.

    A victim always ranks below the candidate (no priority inversion): when none does, a
    running candidate evicts itself, as vLLM does.
    """

    def __init__(
        self, view: InstanceView, rank_key: Callable[[Request], tuple[float, float, int]]
    ) -> None:
        self.view = view
        self.rank_key = rank_key
        self._order: list[Request] | None = None

    def _eligible(self, cand: Request, in_batch: set[int], gone: set[int]) -> Iterator[Request]:
        if self._order is None:
            self._order = sorted(self.view.running, key=self.rank_key, reverse=True)
        cand_rank = self.rank_key(cand)
        for v in self._order:
            if v.req_id in gone or v.req_id in in_batch or v is cand:
                continue
            if self.rank_key(v) <= cand_rank:
                return  # everything left ranks above the candidate
            yield v

    def pick(self, cand: Request, in_batch: set[int], gone: set[int]) -> Request | None:
        return next(self._eligible(cand, in_batch, gone), None)

    def capacity(self, cand: Request, in_batch: set[int], st: State, kv: KVCacheManager) -> int:
        """Blocks that evicting every eligible victim would free."""
        return sum(
            kv.num_request_blocks(v.req_id) + st.promised.get(v.req_id, 0)
            for v in self._eligible(cand, in_batch, st.gone)
        )
