"""The discrete-event kernel: one clock, one heap, no globals.

Events are plain callbacks ordered by ``(time, priority, seq)``. The sequence number makes
ties deterministic: two events at the same time and priority run in scheduling order.
Lower priority values run first at equal times; arrivals use :data:`PRIO_ARRIVAL` so that an
instance finishing an iteration at the same instant already sees them.

Besides the heap, the environment keeps the times of the pending events that are not
iterations (:meth:`peek_external`): in a cluster, a replica's fast path only needs to stop
at events that can reach it (arrivals, control), not at other replicas' iterations.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

PRIO_ARRIVAL = 0
PRIO_CONTROL = 5
PRIO_ITERATION = 10

Callback = Callable[[], None]


class Environment:
    """Owns simulated time and the event heap."""

    __slots__ = ("_ext", "_heap", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Callback]] = []
        self._seq = 0
        self._ext: list[float] = []
        """Times of the pending events whose priority is not PRIO_ITERATION (a heap)."""

    def schedule(self, time: float, callback: Callback, priority: int = PRIO_CONTROL) -> None:
        """Run ``callback`` at ``time`` (never in the past)."""
        if time < self.now:
            raise ValueError(f"cannot schedule an event in the past ({time} < {self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, priority, self._seq, callback))
        if priority != PRIO_ITERATION:
            heapq.heappush(self._ext, time)

    def peek(self) -> float:
        """Time of the next event, or +inf when none is pending."""
        return self._heap[0][0] if self._heap else math.inf

    def peek_external(self) -> float:
        """Time of the next event that is not an iteration, or +inf when none is pending."""
        return self._ext[0] if self._ext else math.inf

    def step(self) -> bool:
        """Run the next event; False when there is none."""
        if not self._heap:
            return False
        time, prio, _seq, callback = heapq.heappop(self._heap)
        if prio != PRIO_ITERATION:
            heapq.heappop(self._ext)  # events leave in time order: this one is the earliest
        self.now = time
        callback()
        return True

    def run(self, until: float = math.inf) -> None:
        """Run events while the next one is at or before ``until``; the clock ends at
        ``until`` if it is finite, else at the last event."""
        heap = self._heap
        ext = self._ext
        pop = heapq.heappop
        while heap and heap[0][0] <= until:
            time, prio, _seq, callback = pop(heap)
            if prio != PRIO_ITERATION:
                pop(ext)
            self.now = time
            callback()
        if until != math.inf and until > self.now:
            self.now = until

    def __len__(self) -> int:
        return len(self._heap)
