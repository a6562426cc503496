"""Whether a run's requests can ever hit a prefix cache (issue 14: start-up and summary).

Prefix caching matches prompts by their identity blocks (:attr:`Request.hash_ids`: a
Mooncake trace's ``hash_ids``, or the blocks :mod:`sloserve.workloads.sessions` generates
for shared system prompts and multi-turn sessions). A request without them never looks a
prefix up, never registers a unit and so never hits: on such a workload the caching
manager only pays its bookkeeping, and the plain paged manager gives the very same
decisions (its free-block count is the caching manager's when nothing is cached).

The decision is taken once per run, over everything that can create a request during it:

* the open-loop requests known up front (a trace, a mix);
* generated sessions, whose later turns are created while the run goes (their identity
  blocks come from the session plan): any session plan counts as carrying identities;
* closed-loop batch jobs carry no identity (``experiments/runner.py``'s feeder builds
  them without ``hash_ids``), so they never need the cache.

Anything not known in advance — the live gateway, whose prompts arrive over HTTP and are
hashed then — must keep the caching manager: only a simulation that can list its
requests asks this question (``build_instance(..., prefix_identities=...)`` defaults to
True).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sloserve.core.request import Request
    from sloserve.workloads.sessions import SessionPlan


def carries_prefix_identity(requests: Iterable[Request], sessions: SessionPlan | None) -> bool:
    """True when any request of the run (``requests``, or a turn ``sessions`` creates later)
    has prompt identity blocks a prefix cache could match (module docstring)."""
    if sessions is not None:
        return True
    return any(r.hash_ids for r in requests)
