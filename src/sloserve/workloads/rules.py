"""The SLO and QoE rules a workload gives its requests, per class.

SLO rules per class: a preset (``bros``: RT TTFT 0.4 s / TPOT 0.2 s; ``qlm``: end-to-end
deadlines, 30 s for latency-sensitive RT and 300 s for batch BE, our reading of QLM §8's
"< 30 s" and "several minutes"; ``none``) or explicit rules (:class:`ClassRule`). QoE
(Andes, :class:`QoERule`): TTFT target ``max(prompt/5000, 1)`` s and reading speeds, fixed
or drawn from a distribution.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.core.bounds import MAX_RATE, Priority, Seconds, Time, TokenRate, Weight
from sloserve.core.request import SLO, QoESpec, RequestClass


class ClassRule(BaseModel):
    """SLO targets and priority given to every request of one class (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: Seconds | None = None
    tpot_s: Seconds | None = None
    deadline_s: Seconds | None = None
    priority: Priority = 0

    def slo(self) -> SLO:
        return SLO(self.ttft_s, self.tpot_s, self.deadline_s)


SloPreset = Literal["bros", "qlm", "none"]
# The criticality classes (a choice; lower priority is served first): critical and
# standard share the RT targets, standard one priority step below; sheddable gets looser
# targets (TTFT 2 s, TPOT 0.5 s); batch has none (throughput only). Under ``qlm``: 30 s
# deadlines for critical/standard, 60 s for sheddable, 300 s for batch.
_CRIT = (RequestClass.CRITICAL, RequestClass.STANDARD, RequestClass.SHEDDABLE, RequestClass.BATCH)
SLO_PRESETS: dict[str, dict[RequestClass, ClassRule]] = {
    "bros": {
        RequestClass.RT: ClassRule(ttft_s=0.4, tpot_s=0.2),
        RequestClass.BE: ClassRule(),
        RequestClass.CRITICAL: ClassRule(ttft_s=0.4, tpot_s=0.2, priority=0),
        RequestClass.STANDARD: ClassRule(ttft_s=0.4, tpot_s=0.2, priority=1),
        RequestClass.SHEDDABLE: ClassRule(ttft_s=2.0, tpot_s=0.5, priority=2),
        RequestClass.BATCH: ClassRule(priority=3),
    },
    "qlm": {
        RequestClass.RT: ClassRule(deadline_s=30.0),
        RequestClass.BE: ClassRule(deadline_s=300.0),
        RequestClass.CRITICAL: ClassRule(deadline_s=30.0, priority=0),
        RequestClass.STANDARD: ClassRule(deadline_s=30.0, priority=1),
        RequestClass.SHEDDABLE: ClassRule(deadline_s=60.0, priority=2),
        RequestClass.BATCH: ClassRule(deadline_s=300.0, priority=3),
    },
    "none": {
        **{c: ClassRule() for c in (RequestClass.RT, RequestClass.BE)},
        **{c: ClassRule(priority=i) for i, c in enumerate(_CRIT)},
    },
}


class _Speed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NormalSpeed(_Speed):
    """Reading speeds from a normal distribution, clipped below at ``min``."""

    kind: Literal["normal"] = "normal"
    mean: TokenRate
    std: float = Field(ge=0, le=MAX_RATE, allow_inf_nan=False)
    min: TokenRate = 0.5

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return np.maximum(rng.normal(self.mean, self.std, size=n), self.min)


class ChoiceSpeed(_Speed):
    """Reading speeds from a discrete set (e.g. demographic groups) with weights."""

    kind: Literal["choice"] = "choice"
    values: list[TokenRate] = Field(min_length=1)
    weights: list[Weight] | None = None

    @model_validator(mode="after")
    def _match(self) -> ChoiceSpeed:
        if self.weights is not None and (
            len(self.weights) != len(self.values) or sum(self.weights) <= 0
        ):
            raise ValueError("weights must match values in length and not all be 0")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        w = np.asarray(self.weights if self.weights is not None else [1.0] * len(self.values))
        return np.asarray(self.values)[rng.choice(len(self.values), size=n, p=w / w.sum())]


SpeedDist = Annotated[NormalSpeed | ChoiceSpeed, Field(discriminator="kind")]
# Andes Figure 2's means (4.8 tokens/s reading, 3.3 listening, at 1.3 tokens per word). The
# figure's spread is not given in the text: a 20% coefficient of variation is our choice.
SPEED_PRESETS: dict[str, NormalSpeed] = {
    "reading": NormalSpeed(mean=4.8, std=0.96),
    "listening": NormalSpeed(mean=3.3, std=0.66),
}


class QoERule(BaseModel):
    """How each request's Andes QoE spec is set.

    TTFT target: ``ttft_s`` if given, else Andes' rule ``max(prompt / prefill_tokens_per_s,
    min_ttft_s)`` (a user expects a longer prompt to take longer). Speed: ``tokens_per_s``,
    a number (Andes' mean reading speed, 4.8 tokens/s, by default), a preset name
    (``reading``, ``listening``) or a distribution (``normal``, ``choice``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: Time | None = None
    prefill_tokens_per_s: TokenRate = 5000.0
    min_ttft_s: Time = 1.0
    tokens_per_s: TokenRate | Literal["reading", "listening"] | SpeedDist = 4.8

    def ttft(self, prompt_tokens: int) -> float:
        if self.ttft_s is not None:
            return self.ttft_s
        return max(prompt_tokens / self.prefill_tokens_per_s, self.min_ttft_s)

    def speeds(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        s = self.tokens_per_s
        if isinstance(s, (int, float)):
            return np.full(n, float(s))
        dist = SPEED_PRESETS[s] if isinstance(s, str) else s
        return dist.sample(rng, n)

    def spec(self, prompt_tokens: int, speed: float | None = None) -> QoESpec:
        if speed is None:
            speed = float(self.tokens_per_s) if isinstance(self.tokens_per_s, (int, float)) else 4.8
        return QoESpec(self.ttft(prompt_tokens), speed)
