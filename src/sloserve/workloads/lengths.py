"""Token-length distributions. Every sampler returns integers >= 1.

Extension point: add a pydantic model with ``kind`` and ``sample(rng, n)`` to
:data:`LengthDist`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Dist(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FixedLength(_Dist):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        return np.full(n, self.value, dtype=np.int64)


class UniformLength(_Dist):
    """Uniform integers in [low, high], both inclusive."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"uniform length: high ({self.high}) < low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


class LognormalLength(_Dist):
    """A lognormal with the given mean and standard deviation (of the lengths themselves),
    rounded and clipped to [min, max]. Published workloads report mean and std only; a
    lognormal is the usual right-skewed fit for them."""

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0)
    std: float = Field(gt=0)
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        sigma2 = math.log1p((self.std / self.mean) ** 2)
        mu = math.log(self.mean) - sigma2 / 2
        x = np.rint(rng.lognormal(mu, math.sqrt(sigma2), size=n)).astype(np.int64)
        return np.clip(x, self.min, self.max if self.max is not None else None)


LengthDist = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="kind")]
