"""Aladdin's reproduction (§6 in simulation): ``plan`` (what runs), ``reproduce`` (run
it, the fewest GPUs per router and rate, N_w's fit, headline numbers), ``testbed``
(Figs. 9/10 on one machine, Fig. 13's overhead), ``planner_gap`` (N_w against the capacity
planner), ``whatif`` (vLLM's default with slower all-reduces), ``figures``."""

from sloserve.experiments.aladdin.plan import Plan
from sloserve.experiments.aladdin.reproduce import Reproduction, reproduce

__all__ = ["Plan", "Reproduction", "reproduce"]
