"""``sloserve reproduce bros``: BROS' evaluation (§7) in simulation
(``/work/shared/papers/bros.txt``).

* :mod:`.plan` — the experiments and their grid (:class:`Plan`, :class:`Scenario`,
  :class:`Run`), the measured capacities that scale it, and the choices where the paper
  is vague;
* :mod:`.reproduce` — each run's results, the whole grid (:func:`reproduce`) and the
  headline numbers beside the paper's (:data:`PAPER`, :data:`GAPS`);
* :mod:`.overhead` — the scheduling overhead of §7.4.2 (Figure 14);
* :mod:`.figures` — the plots (Figures 10–14) and the summary tables.
"""

from sloserve.experiments.bros.figures import be_batch_table, plot, summary_table
from sloserve.experiments.bros.overhead import measure_overhead
from sloserve.experiments.bros.plan import (
    Plan,
    Run,
    RunFailed,
    Scenario,
    plan_runs,
    rt_capacity,
    validate_plan,
)
from sloserve.experiments.bros.reproduce import (
    GAPS,
    PAPER,
    Reproduction,
    execute,
    execute_keep_going,
    headline,
    reproduce,
)

__all__ = [
    "GAPS",
    "PAPER",
    "Plan",
    "Reproduction",
    "Run",
    "RunFailed",
    "Scenario",
    "be_batch_table",
    "execute",
    "execute_keep_going",
    "headline",
    "measure_overhead",
    "plan_runs",
    "plot",
    "reproduce",
    "rt_capacity",
    "summary_table",
    "validate_plan",
]
