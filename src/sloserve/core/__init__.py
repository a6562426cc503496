"""Core types shared by every layer: requests, SLOs, QoE specs, errors, predictors."""

from sloserve.core.errors import (
    ConfigError,
    InvalidTransition,
    SchedulerViolation,
    SloserveError,
    StallError,
    UnknownNameError,
    WorkloadError,
)
from sloserve.core.predictor import OutputLengthPredictor, make_predictor
from sloserve.core.request import SLO, QoESpec, Request, RequestClass, RequestStatus

__all__ = [
    "SLO",
    "ConfigError",
    "InvalidTransition",
    "OutputLengthPredictor",
    "QoESpec",
    "Request",
    "RequestClass",
    "RequestStatus",
    "SchedulerViolation",
    "SloserveError",
    "StallError",
    "UnknownNameError",
    "WorkloadError",
    "make_predictor",
]
