"""BROS: co-serving real-time (RT) and best-effort (BE) requests on one replica
(``/work/shared/papers/bros.txt``).

* :mod:`.scheduler` — Algorithm 1 (§4): :class:`BROSScheduler`, :func:`make_bros`
  (policies ``bros`` and ``bros-nobicache``);
* :mod:`.config` — its parameters, :class:`BROSConfig`;
* :mod:`.ranking` — RT requests by residual time (Figure 8's request pulling), BE
  requests by checkpointed blocks;
* :mod:`.plan` — the dry-run batch plan: KV blocks, running slots and budgets one
  decision uses up (FindBlock, FindPreemptBlock, progressive dropping's evictions);
* :mod:`.cost` — the batch's predicted iteration time, ``max(execution, swap)`` (§4.1);
* :mod:`.rr` — the round-robin baseline ``rr`` (§2.2, §7).

The bidirectional KV blocks (§5) are an engine part any policy could use:
:mod:`sloserve.engine.kv_bidirectional`.
"""

from sloserve.policies.bros.config import BROSConfig
from sloserve.policies.bros.rr import RoundRobinScheduler, RRConfig, make_rr
from sloserve.policies.bros.scheduler import BROSScheduler, make_bros

__all__ = [
    "BROSConfig",
    "BROSScheduler",
    "RRConfig",
    "RoundRobinScheduler",
    "make_bros",
    "make_rr",
]
