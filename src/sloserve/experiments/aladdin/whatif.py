"""What-if: the headline against vLLM's default if a whole-machine worker's all-reduces cost
more than our cost model charges.

Why (measured, ``benchmarks/aladdin_tp_comm.py``): in the simulator a 4-GPU Llama-2-70B
worker on the PCIe A100 decodes a lone request in 32 ms and a 2-GPU one in 54 ms; the gap
is the weight read each GPU does (48 vs 26 ms), not the all-reduces (about 5 ms for the
161 of an iteration at either degree, in line with Vidur's measured A100 collectives).
Under the 75 ms ATGT SLO that gives the whole-machine worker twice the headroom, and
vLLM's default needs fewer GPUs than Aladdin. The paper found the opposite on a machine
whose 4 A100s talk over PCIe only, and its text notes the default's lower ATGT at low
rates on its NVLink V100 machine alone (§6.3). For the whole-machine worker to decode a
lone request no faster than Table 3's, each of its all-reduces has to cost
``(t_lone(machine) − t_lone(tp))/(2·layers + 1)`` more than the model's: the *break-even*
extra latency (138 µs for the 70B). No published all-reduce measurement of 4 A100 PCIe
GPUs was found; the small-message NCCL all-reduces published for other PCIe-only machines
take 20–42 µs (T4, V100, RTX 4090; sources on the Aladdin docs page), about the 30 µs our
PCIe profile charges and 4–8 times below the break-even's 169 µs, so this stays a
what-if.

This module re-prices only the whole-machine worker (``RooflineParams.allreduce_latency_s``
raised by each extra latency; everything else is the scenario's profile, rebuilt from the
same specs) and searches the fewest GPUs of the ``vllm-default`` arm again, so the
headline can be read as a function of that one unmeasured number. The worker Aladdin and
JSQ use is not touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from sloserve.experiments.aladdin.plan import Arm, Plan, Scenario

DEFAULT_ARM = Arm("vllm-default", "least-outstanding", default_worker=True)


def lone_decode_s(profile: str, context: int = 600) -> float:
    """Seconds of one decode iteration of a single request reading ``context`` tokens."""
    from sloserve.costmodel.base import BatchStats
    from sloserve.costmodel.profile import load_profile

    cm = load_profile(profile).cost_model()
    return cm.batch_time(BatchStats(num_decode=1, decode_context_sum=context))


def break_even_extra_s(sc: Scenario) -> float:
    """Extra seconds per all-reduce at which the whole-machine worker decodes a lone
    request as slowly as Table 3's worker (0 when it is not faster to begin with)."""
    from sloserve.costmodel import catalog

    n_ar = 2 * catalog.model_spec(sc.model).num_layers + 1
    gap = lone_decode_s(sc.profile(sc.tp)) - lone_decode_s(sc.profile(sc.machine_gpus))
    return max(gap, 0.0) / n_ar


def slow_allreduce_profile(sc: Scenario, extra_s: float, folder: Path) -> Path:
    """A profile YAML of the whole-machine worker with ``extra_s`` more per all-reduce."""
    import yaml

    from sloserve.costmodel.profile import profile_from_specs
    from sloserve.costmodel.roofline import DEFAULT_PARAMS

    params = DEFAULT_PARAMS.model_copy(
        update={"allreduce_latency_s": DEFAULT_PARAMS.allreduce_latency_s + extra_s}
    )
    tp = sc.machine_gpus
    name = f"{sc.model}@{sc.gpu}x{tp}+{extra_s * 1e6:.0f}us-allreduce"
    prof = profile_from_specs(sc.model, sc.gpu, tp, params, name=name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{sc.name}-x{tp}-allreduce+{extra_s * 1e6:.0f}us.yaml"
    path.write_text(yaml.safe_dump(prof.model_dump(mode="json"), sort_keys=False))
    return path


def slow_allreduce_default(
    plan: Plan,
    aladdin_gpus: Mapping[tuple[str, float], int],
    folder: Path,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """scenario, extra_us, lone_ms (the re-priced worker's lone decode), rate, gpus and
    attainment of ``vllm-default`` re-priced, aladdin_gpus (from ``aladdin_gpus``, by
    scenario and rate) and change (Aladdin's relative GPU change against it), for each
    extra latency of ``plan.whatif_extra_us`` (``None``: the scenario's break-even)."""
    from sloserve.experiments.aladdin.reproduce import fewest

    rows = []
    for sc in plan.scenarios:
        if sc.machine_gpus == sc.tp:
            continue
        for extra in plan.whatif_extra_us:
            x = break_even_extra_s(sc) if extra is None else extra * 1e-6
            path = slow_allreduce_profile(sc, x, folder)
            lone = lone_decode_s(str(path))
            for rate in plan.rates:
                w, st = fewest(plan, sc, DEFAULT_ARM, rate, str(path))
                gpus = w * sc.machine_gpus
                al = aladdin_gpus.get((sc.name, rate))
                rows.append(
                    {
                        "scenario": sc.name,
                        "extra_us": round(x * 1e6, 1),
                        "lone_ms": lone * 1e3,
                        "rate": rate,
                        "gpus": gpus,
                        "attainment": st.attainment,
                        "aladdin_gpus": al,
                        "change": None if al is None else al / gpus - 1,
                    }
                )
                if progress is not None:
                    progress(f"what-if {sc.name} +{x * 1e6:.0f} us {rate:g}/s: {gpus} GPUs")
    return pd.DataFrame(rows)
