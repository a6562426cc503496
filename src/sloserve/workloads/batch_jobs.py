"""Closed-loop best-effort batch jobs: the requests of one batch (BROS' BE workload).

The batch *schedule* (when the next batch is submitted) is the runner's; this module draws
one batch's requests from the workload's rules."""

from __future__ import annotations

import numpy as np

from sloserve.core.request import QoESpec, Request
from sloserve.workloads.mixes import get_mix
from sloserve.workloads.replay import clip_lengths
from sloserve.workloads.spec import BatchJobs, WorkloadSpec


def batch_job_requests(
    jobs: BatchJobs,
    spec: WorkloadSpec,
    rng: np.random.Generator,
    *,
    first_id: int,
    at: float,
    max_context: int | None,
) -> list[Request]:
    """One batch of best-effort requests submitted at ``at`` (ids from ``first_id``)."""
    mix = get_mix(jobs.mix)
    prompts, outputs = mix.sample(rng, rng, jobs.batch_size)
    prompts, outputs = clip_lengths(prompts, outputs, spec.max_context or max_context)
    rule = spec.rule(jobs.req_class)
    slo = rule.slo()
    speeds = spec.qoe.speeds(rng, jobs.batch_size)
    return [
        Request(
            req_id=first_id + i,
            arrival=at,
            num_prompt_tokens=int(prompts[i]),
            true_output_len=int(outputs[i]),
            req_class=jobs.req_class,
            priority=rule.priority,
            slo=slo,
            qoe=QoESpec(spec.qoe.ttft(int(prompts[i])), float(speeds[i])),
        )
        for i in range(jobs.batch_size)
    ]
