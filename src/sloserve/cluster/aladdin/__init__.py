"""Aladdin (Nie, Fonseca, Liu): joint placement and scaling for SLO-aware LLM serving.

One module per concept: ``perf_models`` (§3 fits), ``allreduce`` and ``worker_config``
(§4.1), ``lengths`` (§2.3/§4.3 output-length prediction), ``placement`` (§4.2 Alg. 1),
``rebalance`` (§4.3 Alg. 2), ``router`` (the ``aladdin`` router: heartbeat scaling §5.2,
split prefill/decode §5.1, grouped scheduling Appendix A) and ``gpu_count`` (the
analytic worker count N_w = ⌈k5·r_a + c5⌉). Paper: ``../shared/papers/aladdin.txt``.
"""

from sloserve.cluster.aladdin.allreduce import AllReduceFit, fit_all_reduce
from sloserve.cluster.aladdin.lengths import LengthPredictor, OracleLengths
from sloserve.cluster.aladdin.perf_models import (
    PerfModels,
    PerfSamples,
    fit_models,
    fit_profile,
    samples_from_cost_model,
    samples_from_csv,
)
from sloserve.cluster.aladdin.placement import Placement, Slo
from sloserve.cluster.aladdin.rebalance import Move, Rebalancer
from sloserve.cluster.aladdin.worker_config import (
    TPOption,
    WorkerConfig,
    choose_worker_config,
    worker_config_for,
)

__all__ = [
    "AllReduceFit",
    "LengthPredictor",
    "Move",
    "OracleLengths",
    "PerfModels",
    "PerfSamples",
    "Placement",
    "Rebalancer",
    "Slo",
    "TPOption",
    "WorkerConfig",
    "choose_worker_config",
    "fit_all_reduce",
    "fit_models",
    "fit_profile",
    "samples_from_cost_model",
    "samples_from_csv",
    "worker_config_for",
]
