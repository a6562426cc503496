"""``sloserve reproduce andes``: Andes' evaluation (§6.3–§6.4) in simulation. Paper:
``/work/shared/papers/andes.txt``.

* :mod:`.plan`: what runs (scenarios, the grid of burst, Poisson and ablation runs);
* :mod:`.reproduce`: running the grid, the headline numbers beside the paper's;
* :mod:`.figures`: the plots and the summary table.
"""

from sloserve.experiments.andes.figures import plot, summary_table
from sloserve.experiments.andes.plan import POLICIES, Plan, Run, Scenario, plan_runs
from sloserve.experiments.andes.reproduce import PAPER, Reproduction, headline, reproduce

__all__ = [
    "PAPER",
    "POLICIES",
    "Plan",
    "Reproduction",
    "Run",
    "Scenario",
    "headline",
    "plan_runs",
    "plot",
    "reproduce",
    "summary_table",
]
