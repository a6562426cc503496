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

from sloserve.core.bounds import MAX_TOKENS, Tokens


class _Dist(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FixedLength(_Dist):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    value: Tokens

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        return np.full(n, self.value, dtype=np.int64)


class UniformLength(_Dist):
    """Uniform integers in [low, high], both inclusive."""

    kind: Literal["uniform"] = "uniform"
    low: Tokens
    high: Tokens

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
    mean: float = Field(ge=1, le=MAX_TOKENS, allow_inf_nan=False)
    std: float = Field(gt=0, le=MAX_TOKENS, allow_inf_nan=False)
    min: Tokens = 1
    max: Tokens | None = None

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        sigma2 = math.log1p((self.std / self.mean) ** 2)
        mu = math.log(self.mean) - sigma2 / 2
        x = np.rint(rng.lognormal(mu, math.sqrt(sigma2), size=n))
        # clip in floats first: a heavy tail may exceed int64
        hi = self.max if self.max is not None else MAX_TOKENS
        return np.clip(x, self.min, hi).astype(np.int64)


LengthDist = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="kind")]
