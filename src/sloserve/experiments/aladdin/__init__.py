"""Aladdin's reproduction (§6.4 in simulation): ``plan`` (what runs), ``reproduce`` (run
it, the fewest GPUs per router and rate, N_w's fit, headline numbers), ``figures``."""

from sloserve.experiments.aladdin.plan import Plan
from sloserve.experiments.aladdin.reproduce import Reproduction, reproduce

__all__ = ["Plan", "Reproduction", "reproduce"]
