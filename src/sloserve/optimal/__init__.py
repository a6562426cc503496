"""Exact and reference solvers: Andes' knapsack DP, InferMax's CSP and schedules
(:mod:`sloserve.optimal.infermax`; and later Aladdin's MIP, QLM's plan). Heavy solver
dependencies load lazily in their modules."""

from sloserve.optimal.knapsack import (
    KnapsackSolution,
    brute_force_pack,
    dp_pack,
    greedy_pack,
    quantize_weights,
)

__all__ = ["KnapsackSolution", "brute_force_pack", "dp_pack", "greedy_pack", "quantize_weights"]
