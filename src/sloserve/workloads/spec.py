"""A workload spec (YAML-friendly) and the requests it generates.

Three sources of requests, combinable with closed-loop best-effort batches:

* a named **mix** (:mod:`sloserve.workloads.mixes`) with an **arrival process**;
* a **trace** replayed as given (``trace_use: replay``), after the replay options: time
  window, speed-up, sampling, length caps, mapping of trace labels to classes and models;
* a trace used as an **empirical length distribution** (``trace_use: lengths``, and always
  for ShareGPT, which has no arrival times): (prompt, output) pairs drawn jointly with
  replacement, arrivals from the arrival process.

**Batch jobs** (``batch_jobs``) are BROS §7.1's best-effort load: a batch of requests is
submitted, and the next one when every request of the previous batch has completed (closed
loop; the runner submits them as the simulation goes): at most ``num_batches``, none after
``duration_s`` when both are set.

SLO rules per class and QoE rules: :mod:`sloserve.workloads.rules`.

Randomness: one ``numpy`` generator per component (arrivals, prompt lengths, output
lengths, classes, reading speeds, trace sampling, batch jobs) spawned from ``seed``, so
changing one component leaves the draws of the others unchanged, and the same spec and seed
always give the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.core.bounds import (
    MAX_COUNT,
    MAX_TOKENS,
    Count,
    Factor,
    Fraction,
    Seconds,
    Seed,
    Time,
    Weight,
)
from sloserve.core.request import QoESpec, Request, RequestClass
from sloserve.workloads import sessions as gen
from sloserve.workloads.arrivals import ArrivalProcess, PoissonArrivals
from sloserve.workloads.lengths import LengthDist
from sloserve.workloads.loaders import TraceFormat, load_trace
from sloserve.workloads.mixes import get_mix
from sloserve.workloads.replay import apply_replay, clip_lengths, requests_from_rows
from sloserve.workloads.rules import SLO_PRESETS, ClassRule, QoERule, SloPreset


class ReplayOptions(BaseModel):
    """How a trace with arrival times is replayed (applied in this order)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_s: Time = Field(default=0.0, description="window start (trace time)")
    end_s: Seconds | None = Field(default=None, description="window end (trace time)")
    speedup: Factor = Field(default=1.0, description="k: replay k× faster (rate × k)")
    sample: Fraction | None = Field(default=None, description="keep this fraction")
    max_context: int | None = Field(
        default=None, ge=2, le=MAX_TOKENS, description="cap prompt+output"
    )
    cap: Literal["clip", "drop"] = Field(default="clip", description="clip or drop over the cap")
    class_from: Literal["log_type", "model", "class"] | None = Field(
        default=None, description="trace column mapped to the request class"
    )
    class_map: dict[str, RequestClass] = Field(default_factory=dict)
    default_class: RequestClass = RequestClass.RT
    model_map: dict[str, str] = Field(default_factory=dict, description="rename trace models")

    @model_validator(mode="after")
    def _window(self) -> ReplayOptions:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"replay window: end_s ({self.end_s}) <= start_s ({self.start_s})")
        return self


class BatchJobs(BaseModel):
    """Closed-loop best-effort batches (BROS §7.1): the next batch is submitted when every
    request of the previous one has completed, ``gap_s`` later."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mix: str = "be-synthetic"
    batch_size: int = Field(default=64, ge=1, le=1_000_000)
    num_batches: Count | None = Field(
        default=None,
        description="at most this many batches; none starts after duration_s (if set)",
    )
    start_s: Time = 0.0
    gap_s: Time = 0.0
    req_class: RequestClass = RequestClass.BE

    @model_validator(mode="after")
    def _known(self) -> BatchJobs:
        get_mix(self.mix)
        return self


class WorkloadSpec(BaseModel):
    """Everything that defines the requests of a run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mix: str = Field(default="sharegpt", description="named length mix (ignored when replaying)")
    trace: str | None = Field(default=None, description="trace file (ShareGPT: optional)")
    trace_format: TraceFormat = Field(
        default="auto", description="trace format; auto: detected from the file's header"
    )
    trace_use: Literal["replay", "lengths"] = Field(
        default="replay", description="replay the trace, or draw lengths from it"
    )
    trace_columns: dict[str, str] | None = Field(default=None, description="for format 'table'")
    strict: bool = Field(default=True, description="unsorted arrivals: error (True) or sort")
    drop_failures: bool = Field(default=True, description="BurstGPT: drop 0-response rows")
    tokenizer: str | None = Field(default=None, description="ShareGPT: local tokenizer.json")
    replay: ReplayOptions = Field(default_factory=ReplayOptions)
    arrival: ArrivalProcess = Field(default_factory=lambda: PoissonArrivals(rate=4.0))
    duration_s: Seconds | None = Field(
        default=600.0, description="arrival window (traces: only if set explicitly)"
    )
    num_requests: Count | None = Field(default=None, description="cap on the number of requests")
    prompt: LengthDist | None = Field(
        default=None, description="overrides the mix's prompt lengths"
    )
    output: LengthDist | None = Field(
        default=None, description="overrides the mix's output lengths"
    )
    max_context: int | None = Field(
        default=None, ge=2, le=MAX_TOKENS, description="clip sampled prompt+output to this"
    )
    classes: dict[RequestClass, Weight] | None = Field(
        default=None,
        description="class fractions, e.g. {rt: 0.8, be: 0.2}; default: the mix's class",
    )
    slo: SloPreset | dict[RequestClass, ClassRule] = Field(default="bros")
    models: dict[str, float] | None = Field(
        default=None,
        description="model fractions, e.g. {llama-2-7b: 0.7, llama-2-70b: 0.3}: each "
        "request's model is drawn (seeded); overrides a trace's model column",
    )
    qoe: QoERule = Field(default_factory=QoERule)
    batch_jobs: BatchJobs | None = None
    prefix: gen.PrefixSpec | None = Field(default=None, description="shared system prompts")
    sessions: gen.SessionSpec | None = Field(default=None, description="closed-loop sessions")
    seed: Seed = 0

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSpec:
        if self.trace is None and self.trace_format != "sharegpt":
            get_mix(self.mix)
            if self.duration_s is None and self.num_requests is None:
                raise ValueError("set duration_s or num_requests (or both)")
        if (
            self.num_requests is None
            and self.duration_s is not None
            and self.arrival.rate * self.duration_s > MAX_COUNT
        ):
            # a cap declared with the bounds: more requests than int64 indices / memory hold
            raise ValueError(
                f"rate × duration_s = {self.arrival.rate * self.duration_s:.3g} requests; "
                f"at most {MAX_COUNT:.0e} (lower one, or set num_requests)"
            )
        fractions = list((self.classes or {}).values())
        if self.classes is not None and (any(v < 0 for v in fractions) or sum(fractions) <= 0):
            raise ValueError("class fractions must be >= 0 and not all 0")
        mfrac = list((self.models or {}).values())
        if self.models is not None and (any(v < 0 for v in mfrac) or sum(mfrac) <= 0):
            raise ValueError("model fractions must be >= 0 and not all 0")
        if (
            self.batch_jobs is not None
            and self.batch_jobs.num_batches is None
            and self.duration_s is None
        ):
            raise ValueError("batch_jobs without num_batches need duration_s")
        gen.check_spec(self)
        return self

    @property
    def uses_trace(self) -> bool:
        return self.trace is not None or self.trace_format == "sharegpt"

    def rules(self) -> dict[RequestClass, ClassRule]:
        base = SLO_PRESETS["bros"]
        if isinstance(self.slo, str):
            return dict(SLO_PRESETS[self.slo])
        return {c: self.slo.get(c, base[c]) for c in RequestClass}

    def rule(self, cls: RequestClass) -> ClassRule:
        return self.rules()[cls]


@dataclass
class Workload:
    """Generated requests, what was done to build them, and the closed-loop batch jobs."""

    requests: list[Request]
    notes: list[str] = field(default_factory=list)
    batch_jobs: BatchJobs | None = None
    sessions: gen.SessionPlan | None = None


class _Rngs:
    """One independent generator per component of a workload."""

    def __init__(self, seed: int) -> None:
        # Children are indexed: adding one (model) leaves the others' draws unchanged.
        seqs = np.random.SeedSequence(seed).spawn(8)
        gens = [np.random.default_rng(s) for s in seqs]
        self.arrival, self.prompt, self.output, self.klass, self.speed, self.sample, self.batch = (
            gens[:7]
        )
        self.model = gens[7]


def batch_rng(seed: int) -> np.random.Generator:
    """The generator of the closed-loop batch jobs of a workload with this seed."""
    return _Rngs(seed).batch


def build_requests(spec: WorkloadSpec, *, max_context: int | None = None) -> list[Request]:
    """The requests of ``spec`` (see :func:`build_workload` for notes and batch jobs)."""
    return build_workload(spec, max_context=max_context).requests


def build_workload(spec: WorkloadSpec, *, max_context: int | None = None) -> Workload:
    """Generate (or replay) the requests of ``spec``; with ``models`` set, each request's
    model is then drawn from those fractions (its own seeded generator)."""
    wl = _build_workload(spec, max_context=max_context)
    if spec.models is not None and wl.requests:
        names = list(spec.models)
        probs = np.array([spec.models[m] for m in names], dtype=np.float64)
        picks = _Rngs(spec.seed).model.choice(
            len(names), size=len(wl.requests), p=probs / probs.sum()
        )
        for r, i in zip(wl.requests, picks, strict=True):
            r.model = names[i]
    return wl


def _build_workload(spec: WorkloadSpec, *, max_context: int | None = None) -> Workload:
    """Generate (or replay) the requests of ``spec``.

    ``max_context`` (e.g. the model's context window) clips *sampled* lengths when the spec
    sets none; replayed traces are altered only by the replay options (the engine rejects
    what cannot be served, and says so).
    """
    rngs = _Rngs(spec.seed)
    notes: list[str] = []
    if spec.uses_trace:
        table = load_trace(
            spec.trace,
            spec.trace_format,
            strict=spec.strict,
            columns=spec.trace_columns,
            drop_failures=spec.drop_failures,
            tokenizer=spec.tokenizer,
        )
        notes.extend(table.notes)
        if spec.trace_use == "replay" and table.has_arrivals:
            unused = [
                f
                for f in ("mix", "arrival", "prompt", "output", "classes")
                if f in spec.model_fields_set
            ]
            if unused:
                notes.append(f"replaying {table.source}: {', '.join(unused)} not used")
            rows = apply_replay(table, spec, rngs.sample, notes)
            return Workload(requests_from_rows(rows, spec, rngs.speed), notes, spec.batch_jobs)
        if spec.trace_use == "replay":
            notes.append(
                f"{table.source} has no arrival times: lengths drawn from it, "
                f"arrivals from {spec.arrival.kind}"
            )
        times = spec.arrival.times(rngs.arrival, spec.duration_s, spec.num_requests)
        idx = rngs.prompt.integers(0, table.num_rows(), size=times.size)
        prompts = table.numbers("prompt_tokens")[idx]
        outputs = table.numbers("output_tokens")[idx]
        default_class = RequestClass.RT
    else:
        times = spec.arrival.times(rngs.arrival, spec.duration_s, spec.num_requests)
        mix = get_mix(spec.mix)
        prompts, outputs = mix.sample(rngs.prompt, rngs.output, times.size)
        if spec.prompt is not None:
            prompts = spec.prompt.sample(rngs.prompt, times.size)
        if spec.output is not None:
            outputs = spec.output.sample(rngs.output, times.size)
        default_class = mix.req_class
    prompts, outputs = clip_lengths(prompts, outputs, spec.max_context or max_context)
    n = times.size
    if spec.classes is not None:
        names = list(spec.classes)
        probs = np.array([spec.classes[c] for c in names], dtype=np.float64)
        picks = rngs.klass.choice(len(names), size=n, p=probs / probs.sum())
        classes = [names[i] for i in picks]
    else:
        classes = [default_class] * n
    rules = spec.rules()
    slos = {c: r.slo() for c, r in rules.items()}
    speeds = spec.qoe.speeds(rngs.speed, n)
    out: list[Request] = []
    for i in range(n):
        c = classes[i]
        p = int(prompts[i])
        out.append(
            Request(
                req_id=i,
                arrival=float(times[i]),
                num_prompt_tokens=p,
                true_output_len=int(outputs[i]),
                req_class=c,
                priority=rules[c].priority,
                slo=slos[c],
                qoe=QoESpec(spec.qoe.ttft(p), float(speeds[i])),
            )
        )
    wl = Workload(out, notes, spec.batch_jobs)
    return gen.with_prefixes(wl, spec, max_context) if spec.prefix or spec.sessions else wl
