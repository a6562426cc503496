"""Helpers shared by the trace-loader and workload tests: the request classes, the
location of the shared Azure LLM trace (and the mark that skips without it), a
small-file writer, the Azure replay spec, arrival / length extractors, and a minimal
Azure CSV header and row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sloserve.core.request import Request, RequestClass
from sloserve.workloads import WorkloadSpec

RT = RequestClass.RT
BE = RequestClass.BE


AZURE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"
needs_azure = pytest.mark.skipif(
    not AZURE.is_file(),
    reason=f"the Azure LLM trace is not at {AZURE} (shared data, not in the repo)",
)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def azure_spec(**kw: object) -> WorkloadSpec:
    return WorkloadSpec(trace=str(AZURE), trace_format="azure", slo="none", **kw)  # type: ignore[arg-type]


def arrivals(reqs: list[Request]) -> np.ndarray:
    return np.array([r.arrival for r in reqs], dtype=np.float64)


def pairs(reqs: list[Request]) -> list[tuple[int, int]]:
    return [(r.num_prompt_tokens, r.true_output_len) for r in reqs]


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
