"""QLM's per-instance agent (§5 of ``papers/qlm.txt``): request eviction and GPU↔CPU state
swapping on the replica, as QLM actuates them below its virtual queues.

The cluster-level part of QLM (request groups, virtual queues, RCT estimator, plan
generator, pull, load balancing, model warm start) is ``cluster/qlm/``; it decides *which*
requests reach this replica and when. This agent decides what happens on it when the head
of the virtual queue changes: the new head's requests (the earliest deadlines: the plan
orders groups so that the head has the most urgent deadlines) take the running batch's
place, and the running requests they displace are

- **evicted** (KV dropped; the prompt and the tokens generated so far are recomputed in
  one prefill later), or
- **swapped** to the CPU tier (KV kept; it costs the transfer out and back),

chosen per replica by cost, Insight #2: swap when moving a typical request's KV to host
memory and back (``2 × cost_model.swap_time(n)``) is cheaper than recomputing it
(``cost_model.prefill_time(n)``) *and* the replica has a CPU tier; else evict. ``n`` is
``probe_tokens`` (default 1024). The choice is made once per replica, on its first
decision (its cost model and CPU tier do not change).

It is InferMax's unified scheduler (:mod:`sloserve.policies.infermax.unified`) in its
``single``-group EDF mode with ``evict_for_waiting`` (a waiting request may displace
running requests whose deadline is later) and Sarathi batching; ``evict=False`` is the
"no eviction" ablation (FCFS pulls only), ``state_swap`` forces the mode
(``auto``/``on``/``off``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.engine.interface import InstanceView, PreemptionMode, Scheduler, SchedulerOutput
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler

_SWAP_CHOICES = ("auto", "on", "off")


def swap_is_cheaper(view: InstanceView, probe_tokens: int) -> bool:
    """Insight #2: KV round trip to host memory vs recompute, and a CPU tier to hold it."""
    kv = view.kv
    cpu = getattr(kv, "cpu", None)
    if cpu is None or cpu.capacity_blocks <= 0:
        return False
    cm = view.cost_model
    return 2 * cm.swap_time(probe_tokens) < cm.prefill_time(probe_tokens)


class QLMAgent(UnifiedScheduler):
    """EDF with eviction or state swap, the mode chosen by cost (module docstring)."""

    def __init__(self, *, evict: bool, state_swap: str, probe_tokens: int) -> None:
        base = UnifiedConfig(
            "single" if evict else "prefill-first",
            hybrid=True,
            chunked_prefill=True,
            prefill_tokens=512,
            order="edf",
            evict_for_waiting=evict,
        )
        super().__init__("qlm", base)
        self.state_swap = state_swap
        self.probe_tokens = probe_tokens
        self._decided = state_swap != "auto"
        if state_swap == "on":
            self.config = dataclasses.replace(base, preemption_mode=PreemptionMode.SWAP)

    def describe(self) -> dict[str, object]:
        d = super().describe()
        d["state_swap"] = self.state_swap
        return d

    def schedule(self, view: InstanceView) -> SchedulerOutput:
        if not self._decided:
            self._decided = True
            if swap_is_cheaper(view, self.probe_tokens):
                self.config = dataclasses.replace(self.config, preemption_mode=PreemptionMode.SWAP)
        return super().schedule(view)


def make_qlm_agent(params: Mapping[str, Any]) -> Scheduler:
    """The ``qlm`` policy: ``evict`` (bool, True), ``state_swap`` (auto|on|off, auto),
    ``probe_tokens`` (int, 1024)."""
    p = dict(params)
    evict = p.pop("evict", True)
    swap = p.pop("state_swap", "auto")
    probe = p.pop("probe_tokens", 1024)
    if p:
        raise ConfigError(
            f"policy 'qlm': unknown parameter(s) {', '.join(sorted(p))}; "
            "valid: evict, probe_tokens, state_swap"
        )
    if not isinstance(evict, bool):
        raise ConfigError(f"policy 'qlm': evict must be true or false, got {evict!r}")
    if swap not in _SWAP_CHOICES:
        raise ConfigError(f"policy 'qlm': state_swap must be auto, on or off, got {swap!r}")
    if not isinstance(probe, int) or probe < 1:
        raise ConfigError(f"policy 'qlm': probe_tokens must be an integer >= 1, got {probe!r}")
    return QLMAgent(evict=evict, state_swap=swap, probe_tokens=probe)
