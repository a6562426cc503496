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

from sloserve.core.bounds import Rate, Seconds, UnitInterval


class _Arrivals(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        raise NotImplementedError

    def times(
        self, rng: np.random.Generator, duration: float | None, count: int | None
    ) -> NDArray[np.float64]:
        """Arrivals in [0, duration), at most ``count`` of them (at least one bound is set)."""
        rate: float = getattr(self, "rate")  # noqa: B009 - every subclass has a rate
        # Draw about what the window holds, not a whole (possibly huge) count at once.
        want = max(16, int(rate * (duration or 0) * 1.2) + 16)
        if count is not None:
            want = count if duration is None else min(count, want)
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
    rate: Rate

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return rng.exponential(1.0 / self.rate, size=n)


class GammaArrivals(_Arrivals):
    """Gamma gaps with mean 1/rate and coefficient of variation ``cv`` (burstier when > 1)."""

    kind: Literal["gamma"] = "gamma"
    rate: Rate
    # shape 1/cv² must stay a float numpy can draw from
    cv: float = Field(default=2.0, ge=1e-3, le=100, allow_inf_nan=False)

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (self.rate * shape), size=n)


class ConstantArrivals(_Arrivals):
    """One request every 1/rate seconds, the first at 0."""

    kind: Literal["constant"] = "constant"
    rate: Rate

    def _gaps(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return np.full(n, 1.0 / self.rate)

    def times(
        self, rng: np.random.Generator, duration: float | None, count: int | None
    ) -> NDArray[np.float64]:
        n = math.ceil(duration * self.rate) if duration is not None else 0
        n = n if count is None else (count if duration is None else min(count, n))
        out = np.arange(n, dtype=np.float64) / self.rate
        return out[out < duration] if duration is not None else out


class BurstyArrivals(_Arrivals):
    """Andes-style cyclic bursts: each ``period_s`` starts with a burst lasting
    ``burst_fraction`` of it at ``intensity`` × rate, then a calm phase whose rate keeps the
    average at ``rate``; Poisson within each phase."""

    kind: Literal["bursty"] = "bursty"
    rate: Rate
    intensity: float = Field(default=2.0, gt=1, le=1000, allow_inf_nan=False)
    burst_fraction: float = Field(default=0.35, ge=1e-3, lt=1, allow_inf_nan=False)
    period_s: Seconds = 60.0

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
        # Time rescaling: a unit-rate Poisson process mapped through the inverse of the
        # cumulative intensity. The work is proportional to the arrivals drawn, whatever the
        # number of periods in the window (a 1 ms period over days costs what 1 period does).
        per_period = self.rate * self.period_s  # expected arrivals per period
        burst_len = self.burst_fraction * self.period_s
        burst_mass = self.rate * self.intensity * burst_len
        horizon = None
        if duration is not None:
            whole, tail = divmod(duration, self.period_s)
            part = (
                tail * self.rate * self.intensity
                if tail < burst_len
                else burst_mass + (tail - burst_len) * self.calm_rate
            )
            horizon = whole * per_period + part
        u = PoissonArrivals(rate=1.0).times(rng, horizon, count)
        k, rem = np.divmod(u, per_period)
        in_burst = rem < burst_mass
        with np.errstate(divide="ignore", invalid="ignore"):
            offset = np.where(
                in_burst,
                rem / (self.rate * self.intensity),
                burst_len + (rem - burst_mass) / self.calm_rate,
            )
        arr = k * self.period_s + offset
        if duration is not None:
            arr = arr[arr < duration]
        return arr


class DiurnalArrivals(_Arrivals):
    """A Poisson process whose rate swings sinusoidally around ``rate``:
    ``rate·(1 + amplitude·sin(2π(t/period_s + phase)))``, drawn by thinning."""

    kind: Literal["diurnal"] = "diurnal"
    rate: Rate
    amplitude: UnitInterval = 0.5
    period_s: Seconds = 86400.0
    phase: float = Field(
        default=0.0, ge=-1, le=1, allow_inf_nan=False, description="fraction of a period"
    )

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
        # at most ~1M candidates per draw: memory stays flat at any rate
        chunk = min(max(64, int(peak * min(duration or 3600.0, 3600.0))), 1 << 20)
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
