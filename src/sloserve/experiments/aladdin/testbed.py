"""Aladdin §6.3 (Figs. 9 and 10) in simulation: SLO attainment and P99 ATGT against the
arrival rate on one machine of fixed size, and §6.5 (Fig. 13): the scheduling overhead.

The paper's testbeds are machines of 4 GPUs (A100-80GB over PCIe; V100-32GB over NVLink).
Each arm gets one machine: Aladdin and JSQ on Table 3's worker (``4 / tp`` workers), vLLM's
default one 4-GPU worker with JSQ. Rates (choice: the paper's axes are not in its text)
are fractions (``Plan.testbed_fractions``) of the machine's capacity by Eq. 6,
``4 · T_max / mean output tokens`` (T_max the per-GPU decode throughput of Table 3's
worker from :func:`~sloserve.cluster.aladdin.worker_config.worker_config_for`, the mean
output that of the ``sharegpt`` history), so every scenario is swept from light load to
past what the analytic model says the machine holds.

Fig. 13 (scheduling overhead) is read from Aladdin's own runs: CPU seconds of Algorithm 1
decisions (``AladdinRouter.placement_cpu_s``, ``time.process_time``) per decision and per
second of traffic, at the rate's fewest-GPU cluster (``reproduce``) and on the testbed.
These are measurements on the machine that runs the reproduction (noisy on a shared one);
``benchmarks/aladdin_placement.py`` times the decision at 256 workers and 10,000 requests.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from sloserve.experiments.aladdin.plan import Arm, Plan, Scenario

TESTBED_ARMS = (
    Arm("aladdin", "aladdin"),
    Arm("jsq-optimal", "least-outstanding"),
    Arm("vllm-default", "least-outstanding", default_worker=True),
)
"""Fig. 9/10's three lines: Aladdin, JSQ on the optimal worker, vLLM's default."""


def capacity_rate(sc: Scenario) -> float:
    """Requests/s one machine serves by Eq. 6 on Table 3's worker (module docstring)."""
    from sloserve.cluster.aladdin.lengths import history
    from sloserve.cluster.aladdin.worker_config import worker_config_for

    wc = worker_config_for(sc.model, sc.gpu, (sc.tp,), atgt_s=sc.atgt_ms / 1e3)
    per_gpu = next(o.per_gpu_tokens_s for o in wc.options if o.gpus == sc.tp)
    _, outputs = history("sharegpt")
    return sc.machine_gpus * per_gpu / float(outputs.mean())


def testbed(plan: Plan, progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """scenario, arm, rate, load (the fraction of :func:`capacity_rate`), workers, gpus,
    attainment, p99_atgt_ms, and for Aladdin sched_ms_per_decision / sched_ms_per_s."""
    from sloserve.experiments.aladdin.reproduce import run_stats

    rows = []
    for sc in plan.testbed:
        cap = capacity_rate(sc)
        for arm in TESTBED_ARMS:
            per = sc.machine_gpus if arm.default_worker else sc.tp
            workers = sc.machine_gpus // per
            for frac in plan.testbed_fractions:
                rate = round(cap * frac, 2)
                st = run_stats(plan, sc, arm, rate, workers)
                rows.append(
                    {
                        "scenario": sc.name,
                        "arm": arm.name,
                        "rate": rate,
                        "load": frac,
                        "workers": workers,
                        "gpus": workers * per,
                        **st.row(rate),
                    }
                )
                if progress is not None:
                    progress(
                        f"testbed {sc.name} {arm.name} {rate:g}/s: "
                        f"{st.attainment:.1%} attained, P99 ATGT {st.p99_atgt_ms:.0f} ms"
                    )
    return pd.DataFrame(rows)
