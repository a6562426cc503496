"""Closed-loop sessions during a run: a session's next turn arrives a think time after
its previous turn ended (``workloads/sessions.py`` draws the turns; this submits them).

It chains onto the sink's ``on_done`` hook, as the batch-job feeder does, so a replica
and a cluster run sessions alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from sloserve.core.request import Request
from sloserve.engine.env import PRIO_ARRIVAL, Environment
from sloserve.workloads.sessions import SessionPlan


class _Sink(Protocol):
    on_done: Callable[[Request], None] | None

    def add_request(self, req: Request) -> None: ...


class SessionFeeder:
    """Submits each session's later turns; ``submitted`` lists every turn it created (for
    the run's request table) and ``pending`` counts those not arrived yet."""

    def __init__(self, plan: SessionPlan | None, env: Environment, sink: _Sink) -> None:
        self.submitted: list[Request] = []
        self.pending = 0
        if plan is None or not plan.num_turns:
            return
        self._env, self._sink = env, sink
        previous = sink.on_done

        def on_done(r: Request) -> None:
            if previous is not None:
                previous(r)
            if r.session_id is None:
                return
            nxt = plan.next_request(r, env.now)
            if nxt is not None:
                self.submitted.append(nxt)
                self.pending += 1
                env.schedule(nxt.arrival, functools.partial(self._arrive, nxt), PRIO_ARRIVAL)

        sink.on_done = on_done

    def _arrive(self, r: Request) -> None:
        self.pending -= 1
        self._sink.add_request(r)
