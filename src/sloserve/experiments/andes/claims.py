"""Andes' headline claims (§6.3, Figures 15 and 16) for ``sloserve reproduce all``, read from
``headline.json`` of :func:`~sloserve.experiments.andes.reproduce`: the best scenario of
the run, since the paper's numbers are "up to" ones."""

from sloserve.experiments.headline import Claim

CLAIMS = (
    Claim(
        "qoe_ratio_vs_vllm_intensity",
        "mean QoE, Andes / vLLM, burst intensity sweep (max)",
        4.7,
        ("scenarios", "*", "qoe_ratio_vs_vllm_intensity"),
        null=1.0,
        section="§6.3 Fig. 15",
    ),
    Claim(
        "qoe_ratio_vs_vllm_duration",
        "mean QoE, Andes / vLLM, burst duration sweep (max)",
        3.5,
        ("scenarios", "*", "qoe_ratio_vs_vllm_duration"),
        null=1.0,
        section="§6.3 Fig. 16",
    ),
    Claim(
        "intensity_ratio_at_qoe_0.95",
        "burst intensity sustained at QoE >= 0.95, Andes / vLLM",
        2.6,
        ("scenarios", "*", "intensity_ratio_at_qoe_0.95"),
        null=1.0,
        section="§6.3",
    ),
    Claim(
        "gpu_savings_at_qoe_0.95",
        "GPUs saved at QoE >= 0.95",
        0.61,
        ("scenarios", "*", "gpu_savings_at_qoe_0.95"),
        unit="%",
        section="§6.3",
    ),
)
