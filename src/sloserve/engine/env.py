"""The discrete-event kernel: one clock, one heap, no globals.

Events are plain callbacks ordered by ``(time, priority, seq)``. The sequence number makes
ties deterministic: two events at the same time and priority run in scheduling order.
Lower priority values run first at equal times; arrivals use :data:`PRIO_ARRIVAL` so that an
instance finishing an iteration at the same instant already sees them.

Besides the heap, the environment keeps the times of the pending control events
(:meth:`peek_control`): in a cluster, a replica's fast path stops only at those (faults,
joins, drains, the horizon); a request routed to it mid-run cuts the run instead, which
cancels the run's completion event (:meth:`cancel`) and schedules an earlier one.
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

    __slots__ = ("_cancelled", "_ctl", "_heap", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Callback]] = []
        self._seq = 0
        self._ctl: list[float] = []
        """Times of the pending PRIO_CONTROL events (a heap)."""
        self._cancelled: set[int] = set()
        """Sequence numbers of cancelled events still in the heap (skipped, clock kept)."""

    def schedule(self, time: float, callback: Callback, priority: int = PRIO_CONTROL) -> int:
        """Run ``callback`` at ``time`` (never in the past); returns the event's id."""
        if time < self.now:
            raise ValueError(f"cannot schedule an event in the past ({time} < {self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, priority, self._seq, callback))
        if priority == PRIO_CONTROL:
            heapq.heappush(self._ctl, time)
        return self._seq

    def cancel(self, event: int) -> None:
        """Drop a pending iteration event (by the id :meth:`schedule` returned): it will
        neither run nor move the clock."""
        self._cancelled.add(event)

    def _drop_cancelled(self) -> None:
        heap, cancelled = self._heap, self._cancelled
        while heap and heap[0][2] in cancelled:
            cancelled.discard(heapq.heappop(heap)[2])

    def peek(self) -> float:
        """Time of the next event, or +inf when none is pending."""
        if self._cancelled:
            self._drop_cancelled()
        return self._heap[0][0] if self._heap else math.inf

    def peek_control(self) -> float:
        """Time of the next PRIO_CONTROL event, or +inf when none is pending."""
        return self._ctl[0] if self._ctl else math.inf

    def step(self) -> bool:
        """Run the next event; False when there is none."""
        if self._cancelled:
            self._drop_cancelled()
        if not self._heap:
            return False
        time, prio, _seq, callback = heapq.heappop(self._heap)
        if prio == PRIO_CONTROL:
            heapq.heappop(self._ctl)  # events leave in time order: this one is the earliest
        self.now = time
        callback()
        return True

    def run(self, until: float = math.inf) -> None:
        """Run events while the next one is at or before ``until``; the clock ends at
        ``until`` if it is finite, else at the last event."""
        heap = self._heap
        ctl = self._ctl
        cancelled = self._cancelled
        pop = heapq.heappop
        while heap and heap[0][0] <= until:
            time, prio, seq, callback = pop(heap)
            if prio == PRIO_CONTROL:
                pop(ctl)
            if cancelled and seq in cancelled:
                cancelled.discard(seq)
                continue
            self.now = time
            callback()
        if until != math.inf and until > self.now:
            self.now = until

    def __len__(self) -> int:
        return len(self._heap) - len(self._cancelled)
