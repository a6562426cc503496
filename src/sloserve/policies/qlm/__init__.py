"""QLM's per-replica part (``papers/qlm.txt`` §5): the agent that evicts or swaps when the
head of its virtual queue changes. The cluster-level part (groups, virtual queues, RCT
estimator, plan generator, pull, load balancing, warm start) is ``cluster/qlm/``."""

from sloserve.policies.qlm.agent import QLMAgent, make_qlm_agent, swap_is_cheaper

__all__ = ["QLMAgent", "make_qlm_agent", "swap_is_cheaper"]
