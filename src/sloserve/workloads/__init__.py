"""Workloads: arrival processes, length distributions, named mixes, traces, SLO rules."""

from sloserve.workloads.arrivals import (
    ArrivalProcess,
    BurstyArrivals,
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
)
from sloserve.workloads.lengths import FixedLength, LengthDist, LognormalLength, UniformLength
from sloserve.workloads.mixes import MIXES, get_mix, mix_names
from sloserve.workloads.rules import ClassRule, QoERule
from sloserve.workloads.spec import WorkloadSpec, build_requests

__all__ = [
    "MIXES",
    "ArrivalProcess",
    "BurstyArrivals",
    "ClassRule",
    "ConstantArrivals",
    "FixedLength",
    "GammaArrivals",
    "LengthDist",
    "LognormalLength",
    "PoissonArrivals",
    "QoERule",
    "UniformLength",
    "WorkloadSpec",
    "build_requests",
    "get_mix",
    "mix_names",
]
