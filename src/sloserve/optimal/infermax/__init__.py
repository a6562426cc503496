"""InferMax's optimal schedules (§3.3 of ``papers/infermax.txt``): the CSP on OR-Tools CP-SAT
(:mod:`.options` what it is asked, :mod:`.model` the CP-SAT model, :mod:`.warm` its warm
start, :mod:`.solve`), fixed schedules and their evaluation (:mod:`.schedule`), engine
replay and policy recording (:mod:`.replay`), and an exhaustive search to check the CSP on
tiny instances (:mod:`.exhaustive`). OR-Tools loads only when :func:`solve` runs.
"""

from sloserve.optimal.infermax.exhaustive import ExhaustiveResult, exhaustive_optimum
from sloserve.optimal.infermax.options import (
    OBJECTIVES,
    Baseline,
    CspOptions,
    CspResult,
    SolverUnavailable,
    run_baseline,
)
from sloserve.optimal.infermax.replay import record_policy, replay
from sloserve.optimal.infermax.schedule import (
    Evaluation,
    Job,
    Schedule,
    ScheduledBatch,
    evaluate,
    jobs_from_requests,
    read_schedule,
    uniform_jobs,
    write_schedule,
)
from sloserve.optimal.infermax.solve import batches_needed, solve

__all__ = [
    "OBJECTIVES",
    "Baseline",
    "CspOptions",
    "CspResult",
    "Evaluation",
    "ExhaustiveResult",
    "Job",
    "Schedule",
    "ScheduledBatch",
    "SolverUnavailable",
    "batches_needed",
    "evaluate",
    "exhaustive_optimum",
    "jobs_from_requests",
    "read_schedule",
    "record_policy",
    "replay",
    "run_baseline",
    "solve",
    "uniform_jobs",
    "write_schedule",
]
