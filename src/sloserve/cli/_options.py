"""The options several ``sloserve`` commands share, and how a command takes them.

Each shared flag is declared once here (``*Opt``) with the config path it sets
(``_FLAG_PATHS``); :func:`_with_flags` gives a command the ones it names and hands them
to it as ``flags=`` for ``_app._build_config`` to merge into a ``SimConfig``. The
bounds each flag accepts are appended to its help by ``_app.add_bound_help``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._bounded import METAVARS
from sloserve.cli._prefix import PREFIX_OPTIONS, PREFIX_PATHS
from sloserve.cli._vllm import VLLM_OPTIONS

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE.yaml",
        help="YAML file with any of the settings below (flags override it).",
    ),
]
WorkloadOpt = Annotated[
    str | None, typer.Option("--workload", help="Named length mix: sharegpt, lmsys, be-synthetic.")
]
TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="A trace to replay (format: --trace-format; default sloserve's CSV with "
        "arrival_s,prompt_tokens,output_tokens and optional class,priority,model,"
        "ttft_slo_s,tpot_slo_s,deadline_s,qoe_ttft_s,qoe_tokens_per_s).",
    ),
]
TraceFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--trace-format",
        help="Trace format: sloserve, azure, burstgpt, mooncake, sharegpt, table "
        "(default: detected from the file's header).",
    ),
]
TraceUseOpt = Annotated[
    str | None,
    typer.Option("--trace-use", help="replay the trace, or draw (prompt, output) lengths from it."),
]
ColumnsOpt = Annotated[
    str | None,
    typer.Option(
        "--columns",
        help="Format 'table': name=column pairs, "
        "e.g. arrival_s=ts,prompt_tokens=in,output_tokens=out.",
    ),
]
StrictOpt = Annotated[
    bool | None,
    typer.Option(
        "--strict/--no-strict", help="Unsorted trace arrivals: error, or sort with a note."
    ),
]
KeepFailOpt = Annotated[
    bool | None,
    typer.Option(
        "--keep-failures", help="BurstGPT: keep 0-response rows (they are an error then)."
    ),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option("--tokenizer", help="ShareGPT: local tokenizer.json (default: 1.3 tokens/word)."),
]
SpeedupOpt = Annotated[
    float | None, typer.Option("--speedup", help="Replay the trace k times faster.")
]
WinStartOpt = Annotated[
    float | None, typer.Option("--window-start", help="Replay from this trace time (s).")
]
WinEndOpt = Annotated[
    float | None, typer.Option("--window-end", help="Replay until this trace time (s).")
]
SampleOpt = Annotated[
    float | None, typer.Option("--sample", help="Replay this fraction of the trace.")
]
MaxCtxOpt = Annotated[
    int | None, typer.Option("--max-context", help="Clip prompt+output to this many tokens.")
]
SloOpt = Annotated[str | None, typer.Option("--slo", help="SLO rules preset: bros, qlm, none.")]
ReadingOpt = Annotated[
    str | None,
    typer.Option("--reading-speed", help="QoE tokens/s: a number, 'reading' or 'listening'."),
]
ArrivalOpt = Annotated[
    str | None, typer.Option("--arrival", help="Arrival process: poisson, gamma, bursty, constant.")
]
RateOpt = Annotated[
    float | None,
    typer.Option("--rate", help="Mean arrival rate, requests/s (vLLM: --request-rate)."),
]
CvOpt = Annotated[
    float | None,
    typer.Option(
        "--cv",
        help="Gamma arrivals: coefficient of variation of gaps (vLLM: --burstiness B "
        "gives gamma arrivals with cv = 1/sqrt(B)).",
    ),
]
BurstIOpt = Annotated[
    float | None, typer.Option("--burst-intensity", help="Bursty arrivals: burst rate / mean rate.")
]
BurstFOpt = Annotated[
    float | None,
    typer.Option("--burst-fraction", help="Bursty arrivals: fraction of each period in burst."),
]
BurstPOpt = Annotated[
    float | None, typer.Option("--burst-period", help="Bursty arrivals: period in seconds.")
]
DurationOpt = Annotated[float | None, typer.Option("--duration", help="Arrival window in seconds.")]
NumReqOpt = Annotated[
    int | None,
    typer.Option("--num-requests", help="Cap on the number of requests (vLLM: --num-prompts)."),
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed of the workload.")]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="Replica profile (see `sloserve profiles`) or a profile YAML (vLLM: "
        "--tensor-parallel-size TP turns MODEL@GPU into MODEL@GPUxTP).",
    ),
]
MaxRunOpt = Annotated[
    int | None,
    typer.Option(
        "--max-running", help="R_max: requests holding KV at once (vLLM: --max-num-seqs)."
    ),
]
MaxTokOpt = Annotated[
    int | None,
    typer.Option(
        "--max-batch-tokens", help="C: tokens per iteration (vLLM: --max-num-batched-tokens)."
    ),
]
ChunkOpt = Annotated[
    int | None,
    typer.Option(
        "--chunk-size",
        help="P: prefill tokens per iteration (default: the policy's; vLLM: "
        "--long-prefill-token-threshold, and --no-enable-chunked-prefill sets P = C).",
    ),
]
BlockOpt = Annotated[
    int | None, typer.Option("--block-size", help="KV block size in tokens (1 = token-exact M).")
]
KvUtilOpt = Annotated[
    float | None,
    typer.Option(
        "--kv-utilization",
        help="GPU memory fraction vLLM may use (vLLM: --gpu-memory-utilization).",
    ),
]
KvCapOpt = Annotated[
    int | None,
    typer.Option(
        "--kv-capacity",
        help="Override M, in tokens (vLLM: --num-gpu-blocks-override BLOCKS sets M = BLOCKS "
        "× --block-size).",
    ),
]
PredOpt = Annotated[
    str | None,
    typer.Option(
        "--predictor", help="Output-length predictor: oracle, constant:N, max-tokens[:N]."
    ),
]
CostOpt = Annotated[
    str | None,
    typer.Option("--cost-model", help="constant:SECONDS instead of the profile's model."),
]
HorizonOpt = Annotated[
    float | None, typer.Option("--horizon", help="Abort requests still live at this time (s).")
]
ExecutorOpt = Annotated[
    str | None,
    typer.Option(
        "--executor",
        metavar="local|ray",
        help="Where the simulations run: local processes, or Ray tasks (on $RAY_ADDRESS's "
        "cluster, else a local Ray; needs the 'ray' extra). Default: ray when $RAY_ADDRESS "
        "is set, else local.",
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out", metavar="DIR", help="Write a report folder (parquet, summary.json, plots)."
    ),
]


_DEFAULT_RATE = 4.0  # WorkloadSpec's default arrival rate, requests/s

_FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "workload": ("workload", "mix"),
    "trace": ("workload", "trace"),
    "arrival": ("workload", "arrival", "kind"),
    "rate": ("workload", "arrival", "rate"),
    "cv": ("workload", "arrival", "cv"),
    "burst_intensity": ("workload", "arrival", "intensity"),
    "burst_fraction": ("workload", "arrival", "burst_fraction"),
    "burst_period": ("workload", "arrival", "period_s"),
    "duration": ("workload", "duration_s"),
    "num_requests": ("workload", "num_requests"),
    "seed": ("workload", "seed"),
    "profile": ("instance", "profile"),
    "max_running": ("instance", "max_running"),
    "max_batch_tokens": ("instance", "max_batch_tokens"),
    "chunk_size": ("instance", "chunk_size"),
    "block_size": ("instance", "block_size"),
    "kv_utilization": ("instance", "kv_utilization"),
    "kv_capacity": ("instance", "kv_capacity_tokens"),
    "predictor": ("instance", "predictor"),
    "cost_model": ("instance", "cost_model"),
    "horizon": ("horizon_s",),
    "trace_format": ("workload", "trace_format"),
    "trace_use": ("workload", "trace_use"),
    "columns": ("workload", "trace_columns"),
    "strict": ("workload", "strict"),
    "keep_failures": ("workload", "drop_failures"),
    "tokenizer": ("workload", "tokenizer"),
    "speedup": ("workload", "replay", "speedup"),
    "window_start": ("workload", "replay", "start_s"),
    "window_end": ("workload", "replay", "end_s"),
    "sample": ("workload", "replay", "sample"),
    "max_context": ("workload", "max_context"),
    "slo": ("workload", "slo"),
    "reading_speed": ("workload", "qoe", "tokens_per_s"),
    **PREFIX_PATHS,
}


# Options shared by several commands: declared once, added to each command's signature by
# :func:`_with_flags` (typer reads the signature), and handed over as one ``flags`` dict.
_FLAG_OPTIONS: dict[str, Any] = {
    "workload": WorkloadOpt,
    "trace": TraceOpt,
    "trace_format": TraceFormatOpt,
    "trace_use": TraceUseOpt,
    "columns": ColumnsOpt,
    "strict": StrictOpt,
    "keep_failures": KeepFailOpt,
    "tokenizer": TokenizerOpt,
    "speedup": SpeedupOpt,
    "window_start": WinStartOpt,
    "window_end": WinEndOpt,
    "sample": SampleOpt,
    "max_context": MaxCtxOpt,
    "slo": SloOpt,
    "reading_speed": ReadingOpt,
    "arrival": ArrivalOpt,
    "rate": RateOpt,
    "cv": CvOpt,
    "burst_intensity": BurstIOpt,
    "burst_fraction": BurstFOpt,
    "burst_period": BurstPOpt,
    "duration": DurationOpt,
    "num_requests": NumReqOpt,
    "seed": SeedOpt,
    "profile": ProfileOpt,
    "max_running": MaxRunOpt,
    "max_batch_tokens": MaxTokOpt,
    "chunk_size": ChunkOpt,
    "block_size": BlockOpt,
    "kv_utilization": KvUtilOpt,
    "kv_capacity": KvCapOpt,
    "predictor": PredOpt,
    "cost_model": CostOpt,
    "horizon": HorizonOpt,
    **VLLM_OPTIONS,
    **PREFIX_OPTIONS,
}
for _name, _opt in _FLAG_OPTIONS.items():
    if _name in METAVARS and _opt.__metadata__[0].metavar is None:
        _opt.__metadata__[0].metavar = METAVARS[_name]
_WORKLOAD_FLAGS = (
    "workload",
    "trace",
    "trace_format",
    "trace_use",
    "columns",
    "strict",
    "keep_failures",
    "tokenizer",
    "speedup",
    "window_start",
    "window_end",
    "sample",
    "max_context",
    "slo",
    "reading_speed",
    "arrival",
    "rate",
    "cv",
    "burst_intensity",
    "burst_fraction",
    "burst_period",
    "duration",
    "num_requests",
    "seed",
    "request_rate",
    "num_prompts",
    "burstiness",
)
_INSTANCE_FLAGS = (
    "profile",
    "max_running",
    "max_batch_tokens",
    "chunk_size",
    "block_size",
    "kv_utilization",
    "kv_capacity",
    "predictor",
    "cost_model",
    "horizon",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "long_prefill_token_threshold",
    "num_gpu_blocks_override",
    "tensor_parallel_size",
    "enable_chunked_prefill",
    *PREFIX_OPTIONS,
    "enable_prefix_caching",
)


def _with_flags(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the shared options ``names``; it receives them as ``flags=``."""

    def deco(fn: Callable[..., None]) -> Callable[..., None]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "flags"]
        extra = [
            inspect.Parameter(
                n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=_FLAG_OPTIONS[n]
            )
            for n in names
        ]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> None:
            fn(flags={n: kwargs.pop(n) for n in names}, **kwargs)

        command.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
        return command

    return deco
