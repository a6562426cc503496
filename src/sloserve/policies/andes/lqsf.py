"""Least QoE Slack First (LQSF), the QoE-aware baseline of Andes §6.1.

"vLLM configured with a custom scheduling algorithm that prioritizes requests most at risk
of QoE degradation based on the QoE gain" — and, unlike Andes, "fails to account for the
resource usage of requests". Our reading:

* **Slack.** A request's risk is its Andes QoE gain over the next Δt at the largest
  feasible batch size, ``Q_serve − Q_wait`` (the QoE it loses if it is not served now;
  :func:`sloserve.policies.andes.qoe_predict.predict_qoe`). Requests with more than Δt of
  buffered tokens all have gain 0, so ties are broken by the *time slack*: how long until
  the user runs out of delivered tokens (``A_n + 1/s − now``, or ``T_1 − now`` before the
  first token), least first; then arrival. Least slack = highest gain, then earliest stall.
* **Scheduling** (``preempt_for_waiting=False``, the default): running requests keep
  running; waiting and swapped requests are admitted in LQSF order while their KV blocks
  and R_max allow, stopping at the first that does not fit (vLLM's head-of-line admission
  in LQSF order); when the running requests' KV growth does not fit, the lowest-ranked
  (most slack) running request is evicted, as vLLM evicts its newest. Context length plays
  no part (the difference from Andes' ``gain / l``); no batch-size search, no refiner.
  This matches the paper's result for LQSF, a slight improvement over vLLM.
  ``preempt_for_waiting=True`` also evicts lower-ranked running requests to admit
  higher-ranked waiting ones, as the Andes authors' public LQF code does; in our
  simulations that thrashes (many preemptions per request) and ends well below vLLM.
* **Trigger**: as Andes (``selective``, ``watermark``, ``slot_trigger``): vLLM FCFS until
  the replica is under pressure.
* Execution (cheaper of swap and recompute per victim; vLLM's prefill-only iterations
  without hybrid batching) is shared with Andes
  (:class:`~sloserve.policies.andes.qoe_scheduler.QoEScheduler`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sloserve.engine.interface import InstanceView, Scheduler, SchedulerOutput
from sloserve.policies.andes.config import ModeName, config_from_params
from sloserve.policies.andes.estimate import Estimate
from sloserve.policies.andes.qoe_scheduler import QoEScheduler


@dataclass(frozen=True)
class LQSFConfig:
    """Parameters of LQSF."""

    delta_t: float = 1.0
    """Horizon (s) of the QoE gain that ranks requests (as Andes' Δt)."""
    preemption_mode: ModeName = "auto"
    """``auto`` (cheaper of swap and recompute), ``recompute`` or ``swap``."""
    hybrid: bool = False
    """Decodes may share an iteration with (re)fills."""
    preempt_for_waiting: bool = False
    """Also evict lower-ranked running requests to admit higher-ranked waiting ones, as the
    Andes authors' LQF code does (False: as vLLM, evict only when the running requests' KV
    growth does not fit; LQSF then orders admissions and victims)."""
    selective: bool = True
    """Rank only under pressure (Andes' trigger, see ``watermark``); else vLLM FCFS."""
    watermark: float = 0.9
    """KV occupancy (and R_max fill, with ``slot_trigger``) that engages LQSF."""
    slot_trigger: bool = True
    """Also engage when the running requests fill ``watermark`` of R_max."""
    default_ttft_s: float = 1.0
    """TTFT target for requests without a QoE spec."""
    default_tokens_per_s: float = 4.8
    """Reading speed for requests without a QoE spec."""

    def __post_init__(self) -> None:
        if not self.delta_t > 0:
            raise ValueError(f"delta_t must be > 0, got {self.delta_t}")
        if self.preemption_mode not in ("auto", "recompute", "swap"):
            raise ValueError(
                f"preemption_mode must be auto, recompute or swap, got {self.preemption_mode!r}"
            )
        if not 0 <= self.watermark <= 1:
            raise ValueError(f"watermark must be in [0, 1], got {self.watermark}")
        if not self.default_ttft_s >= 0 or not self.default_tokens_per_s > 0:
            raise ValueError("default_ttft_s must be >= 0 and default_tokens_per_s > 0")


class LQSFScheduler(QoEScheduler):
    """Least QoE Slack First (see the module docstring)."""

    def __init__(self, config: LQSFConfig | None = None, name: str = "lqsf") -> None:
        cfg = config or LQSFConfig()
        super().__init__(
            name,
            delta_t=cfg.delta_t,
            watermark=cfg.watermark,
            selective=cfg.selective,
            slot_trigger=cfg.slot_trigger,
            objective="avg",
            preemption_mode=cfg.preemption_mode,
            hybrid=cfg.hybrid,
            default_ttft_s=cfg.default_ttft_s,
            default_tokens_per_s=cfg.default_tokens_per_s,
        )
        self.config = cfg

    def _decide(self, view: InstanceView, est: Estimate) -> SchedulerOutput:
        _lo, b_max, mean_len = self._batch_range(view, est)
        tau = self._tau(view.cost_model, b_max, mean_len)
        q_serve = est.q_serve(tau)
        gain = self.objective.value(q_serve, est.ctx) - est.v_wait
        est.gain, est.tau, est.q_best = gain, tau, q_serve
        nxt = np.where(est.n > 0, est.a_last + est.inv_s, est.t1)  # next token the user needs
        slack = nxt - est.now
        idx = np.arange(est.size)
        order = np.lexsort((idx, slack, -gain))
        selected = np.zeros(est.size, dtype=np.bool_)
        if self.config.preempt_for_waiting:
            fits = np.searchsorted(np.cumsum(est.blocks[order]), view.kv.num_blocks, "right")
            selected[order[: min(int(fits), b_max)]] = True
        else:
            # Running requests stay; waiting ones are admitted in LQSF order into the room
            # left (vLLM's head-of-line admission with a different order).
            n_run = len(view.running)
            selected[:n_run] = True
            rest = order[order >= n_run]
            room = view.kv.num_blocks - int(est.blocks[:n_run].sum())
            fits = np.searchsorted(np.cumsum(est.blocks[rest]), room, "right")
            selected[rest[: max(0, min(int(fits), view.limits.max_running - n_run))]] = True
        # No batch-size search: every running request decodes (up to R_max).
        return self._execute(view, est, selected, order, view.limits.max_running, refiner=False)


def make_lqsf(params: Mapping[str, Any]) -> Scheduler:
    """Registry factory: ``lqsf`` with :class:`LQSFConfig` parameters."""
    cfg: LQSFConfig = config_from_params(LQSFConfig, "lqsf", params)
    return LQSFScheduler(cfg)
