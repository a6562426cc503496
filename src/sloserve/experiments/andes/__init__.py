"""``sloserve reproduce andes``: Andes' evaluation (§6.3–§6.4) in simulation. Paper:
``/work/shared/papers/andes.txt``.

* :mod:`.plan`: what runs (scenarios, the grid of burst, Poisson and ablation runs);
* :mod:`.reproduce`: running the grid, the headline numbers beside the paper's;
* :mod:`.figures`: the plots;
* :mod:`.tables`: the tables the CLI prints (tidy: no NaN cells, each ratio once).
"""

from sloserve.experiments.andes.figures import plot
from sloserve.experiments.andes.plan import POLICIES, Plan, Run, Scenario, plan_runs
from sloserve.experiments.andes.reproduce import PAPER, Reproduction, headline, reproduce
from sloserve.experiments.andes.tables import (
    ablation_table,
    headline_table,
    policy_table,
    sustained_table,
)

__all__ = [
    "PAPER",
    "POLICIES",
    "Plan",
    "Reproduction",
    "Run",
    "Scenario",
    "ablation_table",
    "headline",
    "headline_table",
    "plan_runs",
    "plot",
    "policy_table",
    "reproduce",
    "sustained_table",
]
