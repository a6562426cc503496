"""Arrival processes. Each yields sorted arrival times in seconds from 0.

Extension point: add a pydantic model with ``kind`` and ``times(rng, duration, count)`` to
:data:`ArrivalProcess`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Arrivals(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        raise NotImplementedError

    def times(
        self, rng: np.random.Generator, duration: float | None, count: int | None
    ) -> NDArray[np.float64]:
        """Arrivals in [0, duration), at most ``count`` of them (at least one bound is set)."""
        rate: float = getattr(self, "rate")  # noqa: B009 - every subclass has a rate
        want = count if count is not None else max(16, int(rate * (duration or 0) * 1.2) + 16)
        out = np.cumsum(self._gaps(rng, want))
        while duration is not None and (count is None or out.size < count) and out[-1] < duration:
            more = np.cumsum(self._gaps(rng, max(16, out.size // 2))) + out[-1]
            out = np.concatenate([out, more])
        if duration is not None:
            out = out[out < duration]
        if count is not None:
            out = out[:count]
        return out


class PoissonArrivals(_Arrivals):
    """Exponential gaps at ``rate`` requests/s."""

    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0)

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return rng.exponential(1.0 / self.rate, size=n)


class GammaArrivals(_Arrivals):
    """Gamma gaps with mean 1/rate and coefficient of variation ``cv`` (burstier when > 1)."""

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0)
    cv: float = Field(default=2.0, gt=0)

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (self.rate * shape), size=n)


class ConstantArrivals(_Arrivals):
    """One request every 1/rate seconds, the first at 0."""

    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0)

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return np.full(n, 1.0 / self.rate)

    def times(
        self, rng: np.random.Generator, duration: float | None, count: int | None
    ) -> NDArray[np.float64]:
        n = count if count is not None else math.ceil((duration or 0) * self.rate)
        out = np.arange(n, dtype=np.float64) / self.rate
        return out[out < duration] if duration is not None else out


class BurstyArrivals(_Arrivals):
    """Andes-style cyclic bursts: each ``period_s`` starts with a burst lasting
    ``burst_fraction`` of it at ``intensity`` × rate, then a calm phase whose rate keeps the
    average at ``rate``; Poisson within each phase."""

    kind: Literal["bursty"] = "bursty"
    rate: float = Field(gt=0)
    intensity: float = Field(default=2.0, gt=1)
    burst_fraction: float = Field(default=0.35, gt=0, lt=1)
    period_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _feasible(self) -> BurstyArrivals:
        if self.intensity * self.burst_fraction >= 1:
            raise ValueError(
                f"bursty arrivals: intensity × burst_fraction must be < 1 to keep the average rate "
                f"(got {self.intensity} × {self.burst_fraction})"
            )
        return self

    @property
    def calm_rate(self) -> float:
        f = self.burst_fraction
        return self.rate * (1 - f * self.intensity) / (1 - f)

    def times(
        self, rng: np.random.Generator, duration: float | None, count: int | None
    ) -> NDArray[np.float64]:
        out: list[NDArray[np.float64]] = []
        total = 0
        start = 0.0
        burst_len = self.burst_fraction * self.period_s
        while True:
            for length, rate in (
                (burst_len, self.rate * self.intensity),
                (self.period_s - burst_len, self.calm_rate),
            ):
                end = start + length
                if duration is not None and start >= duration:
                    break
                if rate > 0:
                    n = rng.poisson(rate * length)
                    t = np.sort(rng.uniform(start, end, size=n))
                    out.append(t)
                    total += n
                start = end
            if (duration is not None and start >= duration) or (
                count is not None and total >= count
            ):
                break
        arr = np.concatenate(out) if out else np.empty(0)
        if duration is not None:
            arr = arr[arr < duration]
        if count is not None:
            arr = arr[:count]
        return arr


class DiurnalArrivals(_Arrivals):
    """A Poisson process whose rate swings sinusoidally around ``rate``:
    ``rate·(1 + amplitude·sin(2π(t/period_s + phase)))``, drawn by thinning."""

    kind: Literal["diurnal"] = "diurnal"
    rate: float = Field(gt=0)
    amplitude: float = Field(default=0.5, ge=0, le=1)
    period_s: float = Field(default=86400.0, gt=0)
    phase: float = Field(default=0.0, description="fraction of a period")

    def rate_at(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.rate * (
            1 + self.amplitude * np.sin(2 * np.pi * (t / self.period_s + self.phase))
        )

    def times(
        self, rng: np.random.Generator, duration: float | None, count: int | None
    ) -> NDArray[np.float64]:
        peak = self.rate * (1 + self.amplitude)
        out: list[NDArray[np.float64]] = []
        total = 0
        t0 = 0.0
        chunk = max(64, int(peak * min(duration or 3600.0, 3600.0)))
        while True:
            cand = t0 + np.cumsum(rng.exponential(1.0 / peak, size=chunk))
            keep = cand[rng.random(chunk) * peak < self.rate_at(cand)]
            t0 = float(cand[-1])
            if duration is not None:
                keep = keep[keep < duration]
            out.append(keep)
            total += keep.size
            if (duration is not None and t0 >= duration) or (count is not None and total >= count):
                break
        arr = np.concatenate(out)
        return arr[:count] if count is not None else arr


ArrivalProcess = Annotated[
    PoissonArrivals | GammaArrivals | ConstantArrivals | BurstyArrivals | DiurnalArrivals,
    Field(discriminator="kind"),
]
