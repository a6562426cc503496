"""InferMax's reproduction (§4 and A.3 of ``papers/infermax.txt``): what runs
(:mod:`.plan`), running it (:mod:`.reproduce`), the §4.5 CSP sweep (:mod:`.csp`), our
numbers beside the paper's (:mod:`.headline`, :mod:`.findings`) and the plots
(:mod:`.figures`)."""

from sloserve.experiments.infermax.csp import csp_eviction_sweep
from sloserve.experiments.infermax.findings import findings_markdown, findings_table
from sloserve.experiments.infermax.headline import PAPER, headline
from sloserve.experiments.infermax.plan import ANALYSES, PAIR_MIXES, Plan, Run, Sim, plan_runs
from sloserve.experiments.infermax.reproduce import Reproduction, execute, reproduce

__all__ = [
    "ANALYSES",
    "PAIR_MIXES",
    "PAPER",
    "Plan",
    "Reproduction",
    "Run",
    "Sim",
    "csp_eviction_sweep",
    "execute",
    "findings_markdown",
    "findings_table",
    "headline",
    "plan_runs",
    "reproduce",
]
