"""Export a workload as the custom JSONL dataset that ``vllm bench serve`` replays.

vLLM's ``--dataset-name custom --dataset-path FILE.jsonl`` reads one JSON object per line
with a ``prompt`` (text) and, when ``--custom-output-len -1`` is given, the per-request
``output_tokens``. sloserve workloads have token counts, not text, so each prompt is a
synthetic text of ``prompt_tokens`` short words ("hi hi hi ..."): one word is one token in
the common BPE tokenizers (Llama, GPT, Qwen), so the prompt lengths match to within the
tokenizer's special tokens; the ``prompt_tokens`` field on each line records the intended
count. Arrival times are not part of the format: ``vllm bench serve`` sends the file at
``--request-rate``/``--burstiness`` (a Poisson or gamma process, like sloserve's own
``--rate``/``--arrival``), so replay the same workload against the gateway and a real engine
with the same rate. The command to run is in ``docs/workloads.md``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sloserve.core.errors import WorkloadError
from sloserve.core.request import Request

PROMPT_WORD = "hi"
"""A word that is a single token in common tokenizers (with its leading space)."""


def synthetic_prompt(tokens: int) -> str:
    """A prompt text of about ``tokens`` tokens."""
    return " ".join([PROMPT_WORD] * tokens)


def vllm_jsonl_lines(requests: Sequence[Request]) -> list[str]:
    """One JSON line per request: ``prompt``, ``output_tokens``, ``prompt_tokens``."""
    return [
        json.dumps(
            {
                "prompt": synthetic_prompt(r.num_prompt_tokens),
                "output_tokens": r.true_output_len,
                "prompt_tokens": r.num_prompt_tokens,
            }
        )
        for r in requests
    ]


def export_vllm_jsonl(requests: Sequence[Request], path: str | Path) -> Path:
    """Write ``requests`` as a ``vllm bench serve`` custom dataset (in arrival order)."""
    out = Path(path)
    if not requests:
        raise WorkloadError(f"{out}: the workload has no requests to export")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(vllm_jsonl_lines(requests)) + "\n", encoding="utf-8")
    except OSError as e:
        raise WorkloadError(f"{out}: cannot write the dataset ({e.strerror})") from e
    return out
