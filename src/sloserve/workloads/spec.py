"""A workload spec (YAML-friendly) and the requests it generates.

Randomness: one ``numpy`` generator per component (arrivals, prompt lengths, output
lengths, classes) spawned from ``seed``, so changing one component leaves the draws of the
others unchanged, and the same spec and seed always give the same requests.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.core.errors import WorkloadError
from sloserve.core.request import SLO, QoESpec, Request, RequestClass
from sloserve.workloads.arrivals import ArrivalProcess, PoissonArrivals
from sloserve.workloads.lengths import LengthDist
from sloserve.workloads.mixes import get_mix
from sloserve.workloads.trace import read_trace


class ClassRule(BaseModel):
    """SLO targets and priority given to every request of one class (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    deadline_s: float | None = Field(default=None, gt=0)
    priority: int = 0

    def slo(self) -> SLO:
        return SLO(self.ttft_s, self.tpot_s, self.deadline_s)


class QoERule(BaseModel):
    """How each request's Andes QoE spec is set.

    TTFT target: ``ttft_s`` if given, else Andes' rule ``max(prompt / prefill_tokens_per_s,
    min_ttft_s)`` (a user expects a longer prompt to take longer). Speed: ``tokens_per_s``
    (Andes' mean reading speed, 4.8 tokens/s, by default).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: float | None = Field(default=None, ge=0)
    prefill_tokens_per_s: float = Field(default=5000.0, gt=0)
    min_ttft_s: float = Field(default=1.0, ge=0)
    tokens_per_s: float = Field(default=4.8, gt=0)

    def spec(self, prompt_tokens: int) -> QoESpec:
        ttft = (
            self.ttft_s
            if self.ttft_s is not None
            else max(prompt_tokens / self.prefill_tokens_per_s, self.min_ttft_s)
        )
        return QoESpec(ttft, self.tokens_per_s)


def _default_rules() -> dict[RequestClass, ClassRule]:
    # BROS §7.1's real-time targets; best-effort requests have none.
    return {RequestClass.RT: ClassRule(ttft_s=0.4, tpot_s=0.2), RequestClass.BE: ClassRule()}


class WorkloadSpec(BaseModel):
    """Everything that defines the requests of a run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mix: str = Field(default="sharegpt", description="named length mix (ignored with trace)")
    trace: str | None = Field(default=None, description="CSV to replay exactly as given")
    arrival: ArrivalProcess = Field(default_factory=lambda: PoissonArrivals(rate=4.0))
    duration_s: float | None = Field(default=600.0, gt=0, description="arrival window")
    num_requests: int | None = Field(
        default=None, ge=1, description="cap on the number of requests"
    )
    prompt: LengthDist | None = Field(
        default=None, description="overrides the mix's prompt lengths"
    )
    output: LengthDist | None = Field(
        default=None, description="overrides the mix's output lengths"
    )
    max_context: int | None = Field(
        default=None, ge=2, description="clip sampled prompt+output to this"
    )
    classes: dict[RequestClass, float] | None = Field(
        default=None,
        description="class fractions, e.g. {rt: 0.8, be: 0.2}; default: the mix's class",
    )
    slo: dict[RequestClass, ClassRule] = Field(default_factory=_default_rules)
    qoe: QoERule = Field(default_factory=QoERule)
    seed: int = 0

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSpec:
        if self.trace is None:
            get_mix(self.mix)
            if self.duration_s is None and self.num_requests is None:
                raise ValueError("set duration_s or num_requests (or both)")
        fractions = list((self.classes or {}).values())
        if self.classes is not None and (any(v < 0 for v in fractions) or sum(fractions) <= 0):
            raise ValueError("class fractions must be >= 0 and not all 0")
        return self

    def rule(self, cls: RequestClass) -> ClassRule:
        return self.slo.get(cls) or _default_rules()[cls]


def build_requests(spec: WorkloadSpec, *, max_context: int | None = None) -> list[Request]:
    """Generate (or replay) the requests of ``spec``.

    ``max_context`` (e.g. the model's context window) clips sampled lengths when the spec
    sets none; traces are never altered, and the engine rejects what cannot be served.
    """
    if spec.trace is not None:
        return _from_trace(spec)
    seeds = np.random.SeedSequence(spec.seed).spawn(4)
    rng_arr, rng_p, rng_o, rng_c = (np.random.default_rng(s) for s in seeds)
    times = spec.arrival.times(rng_arr, spec.duration_s, spec.num_requests)
    n = times.size
    mix = get_mix(spec.mix)
    prompts = (spec.prompt or mix.prompt).sample(rng_p, n)
    outputs = (spec.output or mix.output).sample(rng_o, n)
    cap = spec.max_context or max_context
    if cap is not None:
        prompts = np.minimum(prompts, cap - 1)
        outputs = np.clip(outputs, 1, cap - prompts)
    if spec.classes is not None:
        names = list(spec.classes)
        probs = np.array([spec.classes[c] for c in names], dtype=np.float64)
        picks = rng_c.choice(len(names), size=n, p=probs / probs.sum())
        classes = [names[i] for i in picks]
    else:
        classes = [mix.req_class] * n
    rules = {c: spec.rule(c) for c in RequestClass}
    slos = {c: r.slo() for c, r in rules.items()}
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
                qoe=spec.qoe.spec(p),
            )
        )
    return out


def _from_trace(spec: WorkloadSpec) -> list[Request]:
    assert spec.trace is not None
    t = read_trace(spec.trace)
    out: list[Request] = []

    def pick(col: str, i: int, default: float | None) -> float | None:
        arr = t.slo.get(col)
        if arr is None or np.isnan(arr[i]):
            return default
        return float(arr[i])

    for i in range(t.arrival.size):
        c = RequestClass(t.req_class[i]) if t.req_class is not None else RequestClass.RT
        rule = spec.rule(c)
        slo = SLO(
            pick("ttft_slo_s", i, rule.ttft_s),
            pick("tpot_slo_s", i, rule.tpot_s),
            pick("deadline_s", i, rule.deadline_s),
        )
        p = int(t.prompt[i])
        try:
            out.append(
                Request(
                    req_id=i,
                    arrival=float(t.arrival[i]),
                    num_prompt_tokens=p,
                    true_output_len=int(t.output[i]),
                    req_class=c,
                    priority=rule.priority
                    if t.priority is None or np.isnan(t.priority[i])
                    else int(t.priority[i]),
                    model=t.model[i] if t.model is not None else "default",
                    slo=slo,
                    qoe=spec.qoe.spec(p),
                )
            )
        except ValueError as e:
            raise WorkloadError(f"{spec.trace}: line {i + 2}: {e}") from e
    return out
