"""Aladdin §4.3, Algorithm 2: re-balancing placed requests when output lengths were mispredicted.

Each worker gets an estimation error, the output-length error ``l^e`` and the batch-size
error ``b^e`` of Algorithm 2:

- an ongoing request that outlived its first prediction (it was re-predicted to
  ``l'_pred``, §4.3) makes its worker *underestimated*: ``l^e += l'_pred``, ``b^e += 1``
  (it is still in the batch when the plan had it gone);
- a request that finished before its prediction makes its worker *overestimated*:
  ``l^e += l_real − l_pred`` (negative), ``b^e −= 1``.

The "equivalent error function" of Eq. 4 weighs the two as the decode iteration does:
``e = (k2·l^e + c2·b^e) / √(k2² + c2²)``, the distance of the error point from the line of
no error in decode time. Algorithm 2 then moves *new* requests — placed, not yet started —
from workers with ``e > 0`` to others, each move taking ``(k2·l_pred + c2)/√(k2² + c2²)``
off the source's error and adding it to the destination's, to make ``Σ|e_i|`` smaller.

Choices where the paper is vague:

- **When**: at every heartbeat (``tick_s``) and when a request finishes (the moment an
  overestimate shows up and room frees), over the workers that have waiting requests.
- **Which requests are new**: the router sees no per-request state, only each replica's
  ``waiting`` count; the ``waiting`` most recently placed requests of a worker's ledger are
  taken as its unstarted ones (a vLLM worker admits in arrival order), and the ledger's
  progress estimate for them is corrected: it assumed each started after its prefill,
  but a request waiting on a full worker has generated nothing (its estimated start
  moves to now and a re-prediction that estimate caused is undone). The cluster's
  ``Reroute`` action moves a request only if it has indeed not started there (otherwise
  nothing happens and the ledger stays as it was), so a wrong guess costs nothing.
- **Overestimates** are kept from one re-balancing to the next (Algorithm 2 starts from
  zero each time; a finish seen between two runs counts in the next), and ``l_real`` is the
  router's progress estimate at the finish (a router does not see token counts).
- **Objective**: a move is made when it lowers ``Σ|e_i|``, or keeps it and lowers the
  larger of the two workers' ``|e|`` (so a request can leave an underestimated worker for
  one on plan, which the sum alone does not reward); the destination must meet Algorithm
  1's constraints (b)–(e) for the request, and a destination with the most negative error
  is tried first. Sources are taken largest error first, their newest requests first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sloserve.cluster.aladdin.placement import Placed, Placement, Worker


@dataclass(frozen=True)
class Move:
    """Move request ``req_id`` (placed, unstarted) from worker ``src`` to worker ``dst``."""

    req_id: int | str
    src: int
    dst: int


class Rebalancer:
    """Algorithm 2 over a :class:`Placement`'s ledgers (module docstring)."""

    def __init__(self, placement: Placement) -> None:
        self.pl = placement
        m = placement.m
        self._norm = math.hypot(m.k2, m.c2) or 1.0
        self._early: dict[int, list[float]] = {}
        """Per worker, ``[l^e, b^e]`` of the requests that finished early since the last run."""
        self.moves = 0
        """Moves proposed so far."""

    def finished(self, worker_id: int, p: Placed, now: float) -> None:
        """A request ended on ``worker_id``: record an overestimate if it ended early."""
        w = self.pl.workers.get(worker_id)
        if w is None:
            return
        gen = self.pl.generated(w, p, now)
        if gen < p.l_pred:
            acc = self._early.setdefault(worker_id, [0.0, 0.0])
            acc[0] += gen - p.l_pred
            acc[1] -= 1

    def new_requests(self, w: Worker, waiting: int, now: float) -> list[Placed]:
        """The worker's ``waiting`` most recently placed requests, taken as not started
        (module docstring), newest first. They have generated nothing, whatever the
        ledger's progress estimate assumed: their estimated start moves to ``now`` and a
        re-prediction their estimate caused is undone."""
        newest = sorted(w.requests.values(), key=lambda p: -p.placed_at)[: max(waiting, 0)]
        for p in newest:
            w.requests.restart(p, now)
            w.requests.set_pred(p, p.l_first)
        return newest

    def error(self, w: Worker, now: float, waiting: int = 0) -> float:
        """The worker's equivalent error ``e`` (module docstring), re-predicting first;
        its ``waiting`` newest requests have not started and count as on plan."""
        self.new_requests(w, waiting, now)
        self.pl.refresh(w, now)
        l_e, b_e = self._early.get(w.worker_id, (0.0, 0.0))
        for p in w.requests.values():
            if p.l_pred > p.l_first:
                l_e += p.l_pred
                b_e += 1
        return (self.pl.m.k2 * l_e + self.pl.m.c2 * b_e) / self._norm

    def _delta(self, p: Placed) -> float:
        return (self.pl.m.k2 * p.l_pred + self.pl.m.c2) / self._norm

    def plan(
        self, now: float, waiting: Mapping[int, int], queued_tokens: Mapping[int, int]
    ) -> list[Move]:
        """The moves of Algorithm 2 now. ``waiting``: per UP worker, how many requests wait
        there (the candidates are its newest that many); ``queued_tokens``: per UP worker,
        the prompt tokens queued there (constraint (c) on a destination)."""
        ws = self.pl.workers
        live = [wid for wid in waiting if wid in ws]
        if not any(waiting[wid] > 0 and ws[wid].requests for wid in live):
            self._early.clear()
            return []
        err = {wid: self.error(ws[wid], now, waiting[wid]) for wid in live}
        self._early.clear()
        moves: list[Move] = []
        queued = dict(queued_tokens)
        for src in sorted(live, key=lambda i: (-err[i], i)):
            if err[src] <= 0 or waiting[src] <= 0:
                continue
            for p in self.new_requests(ws[src], waiting[src], now):
                d = self._delta(p)
                for dst in sorted(live, key=lambda i: (err[i], i)):
                    if dst == src:
                        continue
                    before = abs(err[src]) + abs(err[dst])
                    after = abs(err[src] - d) + abs(err[dst] + d)
                    worst = max(abs(err[src] - d), abs(err[dst] + d))
                    better = after < before - 1e-12 or (
                        after <= before + 1e-12 and worst < max(abs(err[src]), abs(err[dst]))
                    )
                    if not better:
                        continue
                    q = queued.get(dst, 0)
                    if self.pl.violated(ws[dst], p.l_in, p.l_pred, now, q) is not None:
                        continue
                    moves.append(Move(p.req_id, src, dst))
                    err[src] -= d
                    err[dst] += d
                    queued[dst] = q + p.l_in
                    break
        self.moves += len(moves)
        return moves
