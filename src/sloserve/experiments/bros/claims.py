"""BROS' headline claims (§7.2–7.3) for ``sloserve reproduce all``, read from the ``ours``
block of ``headline.json`` written by :func:`~sloserve.experiments.bros.reproduce` (the
same keys as :data:`~sloserve.experiments.bros.reproduce.PAPER`)."""

from sloserve.experiments.bros.reproduce import PAPER
from sloserve.experiments.headline import Claim


def _claim(key: str, text: str, unit: str, section: str) -> Claim:
    null = 1.0 if unit == "×" else 0.0
    return Claim(key, text, PAPER[key], ("ours", key), null=null, unit=unit, section=section)


CLAIMS = (
    _claim(
        "sharegpt.norm_latency_reduction_vs_vllm",
        "RT normalized latency cut vs vLLM, ShareGPT",
        "%",
        "§7.2.1",
    ),
    _claim(
        "lmsys.norm_latency_reduction_vs_vllm",
        "RT normalized latency cut vs vLLM, LMSYS",
        "%",
        "§7.2.1",
    ),
    _claim(
        "sharegpt.ttft_attainment_ratio_vs_vllm",
        "RT TTFT attainment, BROS / vLLM, ShareGPT",
        "×",
        "§7.2.2",
    ),
    _claim(
        "micro.norm_latency_reduction_vs_vllm",
        "RT normalized latency cut vs vLLM, pure RT",
        "%",
        "§7.3",
    ),
)
