"""Aladdin §4.1: what the simulator charges a Llama-2-70B decode iteration at TP2 and TP4,
and how much of it is the tensor-parallel all-reduce, against an all-reduce priced from
Vidur's measured collectives.

For each TP degree and decode batch size it prints the profile's iteration time (the linear
cost model every simulation uses), the roofline's split into compute/memory and all-reduce,
and the all-reduce of one iteration estimated from the measured collectives: Llama-2-70B does
2 all-reduces per layer per iteration over 80 layers (the embedding's one is left out here),
each of ``tokens × 8192 × 2`` bytes; the time of one is the median of
``vidur-profiling/network/<topology>/all_reduce.csv`` at that GPU count, interpolated
linearly in the message size (``size`` is bytes: Vidur sizes its fp16 tensor ``size // 2``).
Those tables are NVLink/NVSwitch measurements (no PCIe table exists), so the estimate is a
lower bound for a PCIe testbed like the paper's.

It then splits a lone request's iteration (batch 1) into weight-bound operators (every
non-attention GEMM, the norms and the LM head), attention and all-reduce, prints how much
more each TP4 all-reduce would have to cost than a TP2 one for the two workers to decode a
lone request equally fast, and the §4.1 model's own numbers (Eq. 6, ``sloserve aladdin
config``): the SLO batch, the all-reduce time it charges there, and the per-GPU throughput.

    PYTHONPATH=src python benchmarks/aladdin_tp_comm.py [--vidur ../shared/vidur-profiling]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from sloserve.costmodel.base import BatchStats
from sloserve.costmodel.profile import load_profile

HIDDEN, LAYERS, DTYPE = 8192, 80, 2


def measured_all_reduce_s(table: Path, gpus: int, nbytes: float) -> float:
    """Median seconds of one intra-node all-reduce of ``nbytes`` over ``gpus`` GPUs."""
    df = pd.read_csv(table)
    rows = df[(df["num_workers"] == gpus) & (df["devices_per_node"] == gpus)]
    rows = rows.groupby("size")["time_stats.all_reduce.median"].median().sort_index()
    return float(np.interp(nbytes, rows.index.to_numpy(), rows.to_numpy())) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vidur", default=str(Path(__file__).parents[2] / "shared/vidur-profiling"))
    ap.add_argument("--gpu", default="a100-80gb-pcie")
    ap.add_argument("--context", type=int, default=600, help="KV tokens each request reads")
    a = ap.parse_args()
    net = Path(a.vidur) / "network"
    print(f"Llama-2-70B decode iteration on {a.gpu}, {a.context} context tokens per request")
    hdr = (
        "tp  batch  iter_ms(profile)  roofline_ms  of_which_allreduce_ms  "
        "measured_allreduce_ms(a100_dgx)  (a100_pairwise_nvlink)  sec4.1_fit_ms"
    )
    from sloserve.cluster.aladdin.allreduce import fit_all_reduce
    from sloserve.costmodel import catalog

    gspec = catalog.gpu_spec(a.gpu)
    fit = fit_all_reduce(a.vidur).scaled(
        gspec, "nvlink" if gspec.nvlink_gb_per_s is not None else "pcie"
    )
    print(hdr)
    for tp in (2, 4):
        prof = load_profile(f"llama-2-70b@{a.gpu}x{tp}")
        lin, roof = prof.cost_model(), prof.roofline()
        for b in (1, 8, 32):
            st = BatchStats(num_decode=b, decode_context_sum=b * a.context)
            t_lin = lin.batch_time(st)
            t_roof = float(roof.batch_time(st))
            t_ar = float(roof.all_reduce_time(b))
            nbytes = b * HIDDEN * DTYPE
            meas = [
                2 * LAYERS * measured_all_reduce_s(net / topo / "all_reduce.csv", tp, nbytes)
                for topo in ("a100_dgx", "a100_pairwise_nvlink")
            ]
            print(
                f"{tp:2d}  {b:5d}  {t_lin * 1e3:16.1f}  {t_roof * 1e3:11.1f}  "
                f"{t_ar * 1e3:21.1f}  {meas[0] * 1e3:31.1f}  {meas[1] * 1e3:22.1f}  "
                f"{(2 * LAYERS + 1) * fit.time(nbytes, tp) * 1e3:13.1f}"
            )
    lone = {}
    for tp in (2, 4):
        roof = load_profile(f"llama-2-70b@{a.gpu}x{tp}").roofline()
        weights = float(roof.non_attention_time(1) + roof.lm_head_time(1))
        attn = LAYERS * float(roof.decode_attention_layer_time(1, a.context))
        ar = float(roof.all_reduce_time(1))
        lone[tp] = weights + attn + ar
        print(
            f"lone request, TP{tp}: weight-bound {weights * 1e3:.1f} ms, attention "
            f"{attn * 1e3:.1f} ms, all-reduce {ar * 1e3:.1f} ms ({roof.num_all_reduces} of them)"
        )
    n_ar = 2 * LAYERS + 1
    print(
        f"TP4 equals TP2 on a lone request only if each TP4 all-reduce costs "
        f"{(lone[2] - lone[4]) / n_ar * 1e6:.0f} us more than a TP2 one"
    )
    from sloserve.cluster.aladdin.worker_config import worker_config_for

    wc = worker_config_for("llama-2-70b", a.gpu, (2, 4, 8), atgt_s=0.075, vidur_dir=str(a.vidur))
    for o in wc.options:
        print(
            f"Eq. 6, TP{o.gpus}: SLO batch {o.slo_batch}, all-reduce there "
            f"{o.comm_s_at_slo_batch * 1e3:.1f} ms, KV batch {o.kv_batch:.0f}, "
            f"{o.per_gpu_tokens_s:.0f} tokens/s per GPU"
        )


if __name__ == "__main__":
    main()
