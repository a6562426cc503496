"""Factories that build a scheduler + engine on the CPU in one call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request
from sloserve.costmodel.base import ConstantCostModel, CostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel
from sloserve.engine.env import PRIO_ARRIVAL, Environment
from sloserve.engine.instance import Instance
from sloserve.engine.interface import Limits, Scheduler
from sloserve.metrics.summary import token_times
from sloserve.policies.registry import make_policy


def make_instance(
    policy: str | Scheduler = "vllm",
    *,
    cost: CostModel | None = None,
    M: int = 10_000,
    C: int = 4096,
    P: int | None = None,
    R_max: int = 256,
    block_size: int = 1,
    cpu_blocks: int = 0,
    predictor: str = "oracle",
    multi_step: bool = True,
    params: dict[str, Any] | None = None,
) -> Instance:
    env = Environment()
    sched = make_policy(policy, params) if isinstance(policy, str) else policy
    p = min(P or sched.default_prefill_tokens or C, C)
    limits = Limits(C, p, (M // block_size) * block_size, R_max, block_size)
    return Instance(
        env,
        sched,
        cost or ConstantCostModel(0.01),
        limits,
        make_predictor(predictor),
        cpu_swap_blocks=cpu_blocks,
        multi_step=multi_step,
        check_invariants=True,
    )


def run(inst: Instance, reqs: Sequence[Request]) -> Instance:
    """Feed the requests at their arrival times and run to completion."""
    for r in reqs:
        inst.env.schedule(r.arrival, lambda r=r: inst.add_request(r), PRIO_ARRIVAL)
    inst.env.run()
    return inst


def times(inst: Instance, r: Request) -> np.ndarray:
    return token_times(r, np.asarray(inst.iter_end))


def req(i: int, arrival: float, prompt: int, output: int, **kw: Any) -> Request:
    return Request(
        req_id=i, arrival=arrival, num_prompt_tokens=prompt, true_output_len=output, **kw
    )


def small_linear_cost() -> LinearCostModel:
    """A linear cost model with every term present, small enough for tiny KV caches (the
    property tests' and the prefix-cache runs')."""
    return LinearCostModel(
        LinearCoefficients(
            intercept=0.005,
            token_floor=0.004,
            per_token=2e-5,
            per_decode_kv=1e-6,
            per_prefill_work=1e-8,
        ),
        kv_bytes_per_token=1000,
        swap_bytes_per_s=1e9,
    )
