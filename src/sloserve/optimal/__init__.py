"""Exact and reference solvers: InferMax's CSP and schedules (:mod:`sloserve.optimal.infermax`;
later Aladdin's MIP and QLM's plan). Andes' knapsack solvers are the Andes policy's own
decision procedure and live with it (:mod:`sloserve.policies.andes.knapsack`). Heavy solver
dependencies (OR-Tools) load lazily in their modules."""
