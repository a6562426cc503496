"""InferMax's headline claims (§4.2–4.5) for ``sloserve reproduce all``, read from
``headline.json`` of :func:`~sloserve.experiments.infermax.reproduce` (the paper's numbers
are those of :data:`~sloserve.experiments.infermax.headline.PAPER`)."""

from sloserve.experiments.headline import Claim
from sloserve.experiments.infermax.headline import PAPER

CLAIMS = (
    Claim(
        "sarathi_tps_below_vllm_max",
        "Sarathi TPS below vLLM's, up to",
        PAPER["sarathi_tps_below_vllm_max"],
        ("contention", "sarathi_tps_below_vllm_max"),
        unit="%",
        section="§4.2",
    ),
    Claim(
        "sarathi_tpot_below_vllm_max_x",
        "Sarathi TPOT below vLLM's, up to",
        PAPER["sarathi_tpot_below_vllm_max_x"],
        ("contention", "sarathi_tpot_below_vllm_max_x"),
        null=1.0,
        section="§4.2",
    ),
    Claim(
        "ef_tpot_reduction_max_x.vllm",
        "eviction-free vLLM's TPOT reduction, up to",
        PAPER["ef_tpot_reduction_max_x"]["vllm"],
        ("eviction", "ef_tpot_reduction_max_x", "vllm"),
        null=1.0,
        section="§4.3",
    ),
    Claim(
        "evict_tps_gain_x.M=100.vllm",
        "evicting vLLM's TPS over eviction-free at M = 100",
        PAPER["evict_tps_gain_x"]["M=100"]["vllm"],
        ("memory", "evict_tps_gain_max_x", "M=100", "vllm"),
        null=1.0,
        section="§4.4",
    ),
    Claim(
        "csp_evict_latency_cut_max",
        "the optimum's latency cut vs the best eviction-free schedule (CSP), up to",
        PAPER["csp_evict_latency_cut_max"],
        ("csp", "solver", "evict_cut_max"),
        unit="%",
        section="§4.5",
    ),
)
