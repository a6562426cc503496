"""Batch-time cost models, KV-transfer times and named calibrated replica profiles."""

from sloserve.costmodel.base import BatchStats, ConstantCostModel, CostModel
from sloserve.costmodel.linear import LinearCoefficients, LinearCostModel
from sloserve.costmodel.profile import ReplicaProfile, load_profile, profile_names

__all__ = [
    "BatchStats",
    "ConstantCostModel",
    "CostModel",
    "LinearCoefficients",
    "LinearCostModel",
    "ReplicaProfile",
    "load_profile",
    "profile_names",
]
