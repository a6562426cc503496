"""The capacity planner: the fewest GPUs that meet an SLO-attainment target at each rate,
or the highest rate a fixed cluster sustains, from simulated traffic (``sloserve
capacity``; docs: ``docs/capacity.md``).

Modules, one concept each: :mod:`.slo` (targets, the verdict, early stopping),
:mod:`.space` (arms of the search space, rates), :mod:`.probe` (one simulation),
:mod:`.search` (monotone searches in rounds), :mod:`.planner` (the two questions),
:mod:`.explain` (why the answer's neighbour fails), :mod:`.export` (what a user deploys),
:mod:`.output` (tables, plots and files).
"""
