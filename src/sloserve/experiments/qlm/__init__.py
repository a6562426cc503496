"""QLM's reproduction (``papers/qlm.txt`` §8): :class:`Plan` (what runs),
:func:`reproduce` (run it, headline numbers beside the paper's), the tables and figures."""

from sloserve.experiments.qlm.figures import (
    burst_table,
    group_size_table,
    plot,
    sweep_table,
    system_table,
)
from sloserve.experiments.qlm.headline import PAPER, claims, headline
from sloserve.experiments.qlm.plan import Plan, Run
from sloserve.experiments.qlm.reproduce import (
    Reproduction,
    plan_time_curve,
    reproduce,
    run_one,
)

__all__ = [
    "PAPER",
    "Plan",
    "Reproduction",
    "Run",
    "burst_table",
    "claims",
    "group_size_table",
    "headline",
    "plan_time_curve",
    "plot",
    "reproduce",
    "run_one",
    "sweep_table",
    "system_table",
]
