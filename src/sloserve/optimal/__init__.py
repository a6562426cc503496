"""Exact and reference solvers: Andes' knapsack DP (and, from other modules, InferMax's
CSP, Aladdin's MIP, QLM's plan). Heavy solver dependencies load lazily in their modules."""

from sloserve.optimal.andes import (
    KnapsackSolution,
    brute_force_pack,
    dp_pack,
    greedy_pack,
    quantize_weights,
)

__all__ = ["KnapsackSolution", "brute_force_pack", "dp_pack", "greedy_pack", "quantize_weights"]
