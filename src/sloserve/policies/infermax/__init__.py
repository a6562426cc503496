"""InferMax (``papers/infermax.txt``): the unified scheduler of Algorithm 1 (§3.1) and its
named presets (Table 1, eviction-free variants, EDF, A.3's ranking)."""

from sloserve.policies.infermax.presets import PRESETS
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler

__all__ = ["PRESETS", "UnifiedConfig", "UnifiedScheduler"]
