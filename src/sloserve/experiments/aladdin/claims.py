"""Aladdin's headline claims (§6.4, Figures 11 and 12: GPUs needed at the highest rate) for
``sloserve reproduce all``, read from the ``ours`` block of ``headline.json`` written by
:func:`~sloserve.experiments.aladdin.reproduce` (per scenario; the best scenario counts)."""

from sloserve.experiments.headline import Claim


def _claim(arm: str, text: str, paper: float, section: str) -> Claim:
    return Claim(arm, text, paper, ("ours", "*", arm), unit="%", section=section)


CLAIMS = (
    _claim("vs vllm-default", "GPUs, Aladdin vs vLLM's default placement", -0.71, "§6.4 Fig. 11"),
    _claim("vs jsq-optimal", "GPUs, Aladdin vs JSQ at its best worker size", -0.40, "§6.4 Fig. 11"),
    _claim(
        "split vs jsq-split", "decode GPUs, split phases, Aladdin vs JSQ", -0.60, "§6.4 Fig. 12"
    ),
    _claim(
        "split vs power-of-two-split",
        "decode GPUs, split phases, Aladdin vs power of two",
        -0.49,
        "§6.4 Fig. 12",
    ),
)
