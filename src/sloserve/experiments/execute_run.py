"""Execute mode from a :class:`~sloserve.experiments.runner.SimConfig`: the usual
simulation loop, each iteration a real forward pass (``sloserve simulate --executor torch``).

The profile named by the config still gives the policies their cost model and the
per-iteration predictions; the clock advances by measured time. The KV capacity M is the
config's ``kv_capacity_tokens`` when set, else what fits the device: on CUDA the
``kv_utilization`` fraction of the free memory after the weights, on a CPU
:data:`CPU_KV_TOKENS` (it is host memory, and a CPU run is for tests and examples); never
more than the profile's M. Request lengths are clipped to the model's context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.core.request import Request
from sloserve.costmodel.profile import load_profile
from sloserve.engine.execute import LoadedModel, TorchExecutor, timing_report
from sloserve.experiments.runner import RunResult, SimConfig, simulate
from sloserve.workloads.spec import Workload, build_workload

CPU_KV_TOKENS = 16384


def kv_tokens_for(loaded: LoadedModel, cfg: SimConfig) -> int:
    """M for execute mode (module docstring)."""
    icfg = cfg.instance
    if icfg.kv_capacity_tokens is not None:
        return icfg.kv_capacity_tokens
    profile_m = load_profile(icfg.profile).kv_capacity_tokens(icfg.kv_utilization)
    m = loaded.model
    spec = m.spec
    elem = m.torch.tensor([], dtype=m.dtype).element_size()
    per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * elem
    if m.device.type == "cuda":
        free, _total = m.torch.cuda.mem_get_info(m.device)
        fit = int(free * icfg.kv_utilization // per_token)
    else:
        fit = CPU_KV_TOKENS
    tokens = min(fit, profile_m)
    if tokens < icfg.block_size:
        raise ConfigError(f"--model {loaded.name}: no device memory left for the KV cache")
    return tokens


def simulate_execute(
    cfg: SimConfig,
    loaded: LoadedModel,
    requests: Sequence[Request] | None = None,
    *,
    temperature: float = 0.0,
    check_invariants: bool = False,
) -> tuple[RunResult, TorchExecutor]:
    """Run ``cfg`` with every iteration executed on ``loaded``; the summary gains an
    ``execute`` section (device, model, the measured-vs-predicted report). ``requests``
    replaces the config's workload."""
    icfg = cfg.instance.model_copy(
        update={"kv_capacity_tokens": kv_tokens_for(loaded, cfg), "multi_step": False}
    )
    cfg = cfg.model_copy(update={"instance": icfg})
    profile = load_profile(icfg.profile)
    context = min(profile.model.max_context, loaded.model.spec.max_context)
    workload: Workload | list[Request] = (
        build_workload(cfg.workload, max_context=context) if requests is None else list(requests)
    )
    executor = TorchExecutor(
        loaded, profile.cost_model(), temperature=temperature, seed=cfg.workload.seed
    )
    res = simulate(cfg, workload, check_invariants=check_invariants, executor=executor)
    section: dict[str, Any] = {
        "executor": executor.name,
        "model": loaded.name,
        "device": str(loaded.model.device),
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "kv_capacity_tokens": icfg.kv_capacity_tokens,
        "kv_tokens_transferred": executor.cache.transferred_tokens if executor.cache else 0,
        "timing": timing_report(executor.records),
    }
    res.summary["execute"] = section
    return res, executor
