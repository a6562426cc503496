"""The ``sloserve`` typer app, the options shared by several commands, and ``main``.

``app`` and ``reproduce_app`` (the ``reproduce`` group, shared by the papers' commands) live
here with the shared workload/instance options (:func:`_with_flags`) and the merge of
built-in defaults, a YAML file and flags into a ``SimConfig`` (:func:`_build_config`). Every
command family lives in a module beside this file and registers on ``app`` /
``reproduce_app`` when ``sloserve.cli`` imports it. Every error a user can cause ends as one
line on stderr and exit status 2 (``main``)."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from sloserve.cli._bounded import METAVARS, _field_at, default_text, polish_params
from sloserve.cli._prefix import PREFIX_OPTIONS, PREFIX_PATHS
from sloserve.cli._vllm import VLLM_OPTIONS
from sloserve.config import (
    apply_vllm_names,
    deep_merge,
    error_text,
    read_yaml,
    set_path,
    validation_message,
)
from sloserve.core.bounds import constraint_text
from sloserve.core.errors import ConfigError, SloserveError

app = typer.Typer(
    name="sloserve",
    help="SLO-aware LLM serving: simulate and compare scheduling policies on calibrated replicas.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    plugin: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            metavar="MODULE|FILE.py",
            help="Import this module or .py file first, so the policies, routers and cost "
            "models it registers can be named (repeatable; also $SLOSERVE_PLUGINS and the "
            "'sloserve.plugins' entry points).",
        ),
    ] = None,
) -> None:
    """SLO-aware LLM serving: simulate and compare scheduling policies on calibrated replicas."""
    from sloserve.cli.plugins import load_plugins

    load_plugins(plugin or ())


# Wide enough for the comparison table when output goes to a file or a CI log.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 400)

# ----------------------------------------------------------------------------- options
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


def _speed(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


# Flags whose value needs converting before it goes into the config.
_CONVERT: dict[str, Any] = {
    "columns": lambda v: _parse_columns(v),
    "keep_failures": lambda v: not v,
    "reading_speed": _speed,
}


def _parse_columns(v: str) -> dict[str, str]:
    from sloserve.workloads.loaders import parse_columns

    return parse_columns(v)


def _build_config(
    base: dict[str, Any], config: Path | None, flags: dict[str, Any]
) -> tuple[Any, list[str] | None]:
    """Merge built-in defaults, a YAML file and flags into a SimConfig (+ a policy list)."""
    from sloserve.cli import _vllm
    from sloserve.experiments.runner import SimConfig

    data = apply_vllm_names(dict(base), "built-in defaults")
    source = "built-in defaults"
    flags = _vllm.merge_alias_flags(flags)
    if config is not None:
        data = deep_merge(data, apply_vllm_names(read_yaml(config), str(config)))
        source = str(config)
    _vllm.drop_overridden(data, flags)
    policies = data.pop("policies", None)
    # The cluster sections belong to simulate/compare (see _cluster_config), not the SimConfig.
    data.pop("cluster", None)
    data.pop("routers", None)
    workload = data.get("workload")
    kind = flags.get("arrival")
    if (
        kind is not None
        and isinstance(workload, dict)
        and isinstance(workload.get("arrival"), dict)
    ):
        old = workload["arrival"]
        if old.get("kind", "poisson") != kind:
            # Another process: keep only the mean rate; the old one's shape keys don't apply.
            workload["arrival"] = {"rate": old["rate"]} if "rate" in old else {}
    for name, value in flags.items():
        if value is None:
            continue
        if name in _vllm.DERIVED_FLAGS:
            set_path(data, _vllm.DERIVED_FLAGS[name][0], value)
            source = f"{source} + command line" if "command line" not in source else source
        if name in _FLAG_PATHS:
            if name in _CONVERT:
                value = _CONVERT[name](value)
            set_path(data, _FLAG_PATHS[name], str(value) if isinstance(value, Path) else value)
            if name == "max_context":  # traces are capped by the replay options
                set_path(data, ("workload", "replay", "max_context"), value)
            source = f"{source} + command line" if "command line" not in source else source
    _vllm.resolve_derived(data, source)
    arrival = (
        data.get("workload", {}).get("arrival") if isinstance(data.get("workload"), dict) else None
    )
    if isinstance(arrival, dict):
        arrival.setdefault("kind", "poisson")
        arrival.setdefault("rate", _DEFAULT_RATE)
    if policies is not None and (
        not isinstance(policies, list) or not all(isinstance(p, str) for p in policies)
    ):
        raise SloserveError(f"{source}: 'policies' must be a list of policy names")
    try:
        return SimConfig.model_validate(data), policies
    except ValidationError as e:
        err = e.errors()[0]
        flag = flag_for(tuple(err["loc"]), flags)
        if flag is None or err["type"] == "extra_forbidden":
            raise ConfigError(validation_message(e, source)) from None
        # the value came from a flag: name the flag, as a user typed it
        where = ".".join(
            str(k) for k in err["loc"] if k in _FLAG_PATHS.get(flag[2:].replace("-", "_"), ())
        )
        raise ConfigError(f"{flag} ({where}): {error_text(err)}") from None


reproduce_app = typer.Typer(
    help="Reproduce the papers' evaluations in simulation.", no_args_is_help=True
)
"""The ``reproduce`` group; ``sloserve.cli`` adds it to ``app`` after the other groups
(``sloserve --help`` lists groups in the order they are added)."""


_HELP_DONE = False


def add_bound_help() -> None:
    """Append each shared flag's bounds (``[0 < x ≤ 1e+06]``) to its help, read from the
    config field it sets. Done only when help is shown: the models cost ~0.7 s of imports."""
    global _HELP_DONE
    if _HELP_DONE:
        return
    _HELP_DONE = True
    from sloserve.experiments.runner import SimConfig

    # (--replicas and the command-only options carry their bounds from bounded().)
    from sloserve.workloads.mixes import mix_names

    # the mixes come from the registry, so a plugin's mix is listed too
    workload_opt: Any = WorkloadOpt
    workload_opt.__metadata__[0].help = f"Named length mix: {', '.join(mix_names())}."
    fields = {n: _field_at(SimConfig, path) for n, path in _FLAG_PATHS.items()}
    for name, info in fields.items():
        opt: Any = _FLAG_OPTIONS.get(name)
        text = constraint_text(info) if info is not None else ""
        default = f"\\[default: {_DEFAULT_RATE}]" if name == "rate" else default_text(info)
        text = " ".join(t for t in (text, default) if t)
        if opt is None or not text or name in ("keep_failures",):
            continue
        option = opt.__metadata__[0]
        if option.help and not option.help.endswith("]"):
            option.help = f"{option.help} {text}"


def flag_for(loc: tuple[Any, ...], flags: dict[str, Any]) -> str | None:
    """The command-line flag that set the config value at ``loc`` (union tags skipped)."""
    keys = [str(k) for k in loc]
    for name, path in _FLAG_PATHS.items():
        if flags.get(name) is None:
            continue
        it = iter(keys)
        if keys and keys[0] == path[0] and keys[-1] == path[-1] and all(k in it for k in path):
            return "--" + name.replace("_", "-")
    return None


def _one_line(msg: str) -> None:
    line = " ".join(part.strip() for part in msg.splitlines() if part.strip())
    err_console.print(f"sloserve: error: {line}", markup=False, highlight=False, soft_wrap=True)


def _usage_message(e: Any) -> str:
    msg: str = e.format_message()
    ctx = getattr(e, "ctx", None)
    if ctx is not None and msg.startswith("No such command"):
        group = ctx.command
        if hasattr(group, "list_commands"):
            names = ", ".join(group.list_commands(ctx))
            where = ctx.command_path.split(" ", 1)[1] + " " if " " in ctx.command_path else ""
            msg = f"{msg.rstrip('.')}; valid {where}commands: {names}"
    return msg


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors become one line and exit status 2.

    Click runs with ``standalone_mode=False`` so that its usage errors (a bad value, an
    unknown option or command, a missing argument) reach us as exceptions and get the same
    one line as every other mistake, instead of click's multi-line box."""
    # typer vendors click; its exceptions are the ones a typer command raises
    from typer._click import exceptions as click

    args = sys.argv[1:] if argv is None else argv
    if not args or any(a in ("--help", "-h") for a in args):
        add_bound_help()
    command = typer.main.get_command(app)
    polish_params(command)
    try:
        code = command.main(args=args, prog_name="sloserve", standalone_mode=False)
    except click.NoArgsIsHelpError as e:
        e.show()  # `sloserve` or a group with no arguments: its help, as click shows it
        sys.exit(2)
    except click.ClickException as e:
        _one_line(_usage_message(e))
        sys.exit(2)
    except typer.Abort:
        err_console.print("sloserve: aborted", markup=False, highlight=False)
        sys.exit(130)
    except SloserveError as e:
        _one_line(str(e))
        sys.exit(2)
    except ValidationError as e:
        _one_line(validation_message(e, "input"))
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
