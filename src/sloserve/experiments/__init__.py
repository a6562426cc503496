"""Running experiments: simulations, comparisons, reports (and, later, paper reproductions)."""

from sloserve.experiments.runner import InstanceConfig, RunResult, SimConfig, compare, simulate

__all__ = ["InstanceConfig", "RunResult", "SimConfig", "compare", "simulate"]
