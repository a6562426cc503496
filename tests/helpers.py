"""Factories that build a scheduler + engine on the CPU in one call."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sloserve.core.predictor import make_predictor
from sloserve.core.request import Request
from sloserve.costmodel.base import ConstantCostModel, CostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel
from sloserve.engine.env import PRIO_ARRIVAL, PRIO_CONTROL, Environment
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


def make_drawn_instance(
    policy: str, setup: dict[str, Any], cost: CostModel, params: dict[str, Any], **kw: Any
) -> Instance:
    """:func:`make_instance` from a hypothesis-drawn ``setup`` (keys M, C, P, R_max,
    block_size), with a 64-block CPU tier: the shape the fast-path property tests share."""
    return make_instance(
        policy,
        cost=cost,
        M=setup["M"],
        C=setup["C"],
        P=setup["P"],
        R_max=setup["R_max"],
        block_size=setup["block_size"],
        cpu_blocks=64,
        params=params,
        **kw,
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


def count_schedule_calls(sched: Scheduler) -> list[int]:
    """Wrap ``sched.schedule`` to count its calls; the one-element list holds the count."""
    calls = [0]
    schedule = sched.schedule

    def counted(view: Any) -> Any:
        calls[0] += 1
        return schedule(view)

    sched.schedule = counted  # type: ignore[method-assign]
    return calls


def router_probe(inst: Instance, seen: list[tuple[float, int, float, int]]) -> Callable[[], None]:
    """A ``probe`` for :func:`drive`: appends what a router reads mid-run (the time, the KV
    blocks as if the run were cut now, busy-until, live requests) to ``seen``."""
    from sloserve.engine import fastpath

    env = inst.env

    def probe() -> None:
        seen.append((env.now, fastpath.kv_blocks_at(inst, env.now), inst.busy_until, inst.num_live))

    return probe


def drive(
    inst: Instance,
    reqs: Sequence[Request],
    *,
    cut: bool,
    horizon: float | None,
    probe: Callable[[], None] | None = None,
    probes: Sequence[float] = (),
    aborts: Sequence[tuple[float, int]] = (),
) -> None:
    """Run ``reqs`` on ``inst`` as the runner or a cluster does: each arrives at its time
    (``cut``: as in a cluster, only control events stop fast runs and an arrival cuts the
    run in flight), ``probe()`` is called at each of ``probes`` (what a router reads
    mid-run), ``reqs[i % len(reqs)]`` is aborted at each ``(t, i)`` of ``aborts``, and the
    run ends at ``horizon`` (the rest aborted, as the runner does) or when nothing is left."""
    env = inst.env
    if cut:
        inst.next_event = env.peek_control

    def arrive(r: Request) -> None:
        if cut:
            inst.interrupt()
        inst.add_request(r)

    for r in reqs:
        env.schedule(r.arrival, functools.partial(arrive, r), PRIO_ARRIVAL)
    if probe is not None:
        for t in probes:
            env.schedule(t, probe, PRIO_ARRIVAL)
    for t, i in aborts:
        env.schedule(t, functools.partial(inst.abort, reqs[i % len(reqs)]), PRIO_ARRIVAL)
    if horizon is None:
        env.run()
    else:
        env.schedule(horizon, lambda: None, PRIO_CONTROL)
        env.run(until=horizon)
        inst.abort_all()


def outcome(inst: Instance, reqs: Sequence[Request]) -> dict[str, Any]:
    """What a run produced, to compare two runs of the same requests exactly: each
    request's state and token runs, the iteration log, the trace rows and busy time."""
    return {
        "requests": [
            (
                r.status,
                list(r.token_runs),
                r.first_token_time,
                r.finish_time,
                r.num_computed_tokens,
                r.num_output_tokens,
                r.num_preemptions,
            )
            for r in reqs
        ],
        "iter_end": list(inst.iter_end),
        "trace": dataclasses.asdict(inst.trace),
        "busy": inst.busy_time,
    }
