"""Bounded typer options and the walk from a flag to the config field it sets.

:func:`bounded` gives a command-only option (one that sets no config field) the bound of an
annotated type from :mod:`sloserve.core.bounds`: the check and the ``--help`` suffix both
come from that type. :func:`_field_at` finds the pydantic field behind a shared flag, whose
constraints ``_app.add_bound_help`` appends to the flag's help."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sloserve.core.bounds import Seed, Workers, bound_text, check_value
from sloserve.core.errors import SloserveError


def bounded(kind: Any, *decls: str, help: str, **kw: Any) -> Any:
    """A typer option whose value must lie in the annotated type ``kind``
    (:mod:`sloserve.core.bounds`): the check and the ``--help`` suffix come from ``kind``."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        try:
            return check_value(kind, value, decls[0])
        except SloserveError as e:
            raise typer.BadParameter(str(e).removeprefix(f"{decls[0]}: ")) from None

    return typer.Option(*decls, help=f"{help} {bound_text(kind)}", callback=check, **kw)


def _field_at(model: Any, path: tuple[str, ...]) -> Any:
    """The pydantic FieldInfo at ``path`` below ``model`` (through optionals and unions)."""
    info = None
    for key in path:
        info = None
        for m in _models(model):
            if key in m.model_fields:
                info = m.model_fields[key]
                break
        if info is None:
            return None
        model = info.annotation
    return info


def _models(tp: Any) -> list[Any]:
    """The pydantic models inside an annotation (``A | None``, ``Annotated[A | B, ...]``)."""
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in get_args(tp) for m in _models(a)]


# Metavars of the shared options (cli/_options.py); "" for on/off flags, which take no value.
METAVARS: dict[str, str] = {
    "workload": "NAME",
    "trace": "FILE",
    "trace_format": "FORMAT",
    "trace_use": "replay|lengths",
    "columns": "NAME=COLUMN,...",
    "strict": "",
    "keep_failures": "",
    "tokenizer": "FILE",
    "speedup": "K",
    "window_start": "SECONDS",
    "window_end": "SECONDS",
    "sample": "FRACTION",
    "max_context": "TOKENS",
    "slo": "PRESET",
    "reading_speed": "TOKENS/S|NAME",
    "arrival": "KIND",
    "rate": "RATE",
    "cv": "CV",
    "burst_intensity": "RATIO",
    "burst_fraction": "FRACTION",
    "burst_period": "SECONDS",
    "duration": "SECONDS",
    "num_requests": "N",
    "seed": "SEED",
    "profile": "NAME|FILE",
    "max_running": "N",
    "max_batch_tokens": "TOKENS",
    "chunk_size": "TOKENS",
    "block_size": "TOKENS",
    "kv_utilization": "FRACTION",
    "kv_capacity": "TOKENS",
    "predictor": "SPEC",
    "cost_model": "SPEC",
    "horizon": "SECONDS",
    "enable_chunked_prefill": "",
    "prefix_caching": "",
    "enable_prefix_caching": "",
    "cpu_cache_gib": "GIB",
}


def default_text(info: Any) -> str:
    """``'[default: 256]'`` for a config field with a default ('' for None or required)."""
    from pydantic_core import PydanticUndefined

    if info is None or info.default is PydanticUndefined or info.default is None:
        return ""
    value = info.default
    # escaped: typer renders help as rich markup, where "[default: x]" would be a style tag
    return f"\\[default: {str(value).lower() if isinstance(value, bool) else value}]"


def polish_params(command: Any) -> None:
    """Give every option of ``command`` and its subcommands a metavar that says what it
    takes: on/off flags show none, others without one get their name in capitals (as
    argparse does), never click's type name (``<int>``)."""
    from typer._click.core import Context

    for sub in getattr(command, "commands", {}).values():
        polish_params(sub)
    if hasattr(command, "get_help_option"):
        help_opt = command.get_help_option(Context(command, help_option_names=["--help"]))
        if help_opt is not None:
            help_opt.metavar = ""
    for p in getattr(command, "params", []):
        if getattr(p, "param_type_name", "") == "argument":
            # the argument's name (MODEL) already says what it takes; typer would add its
            # Python type (<str>) in the type column
            p.display_type_rich = lambda ctx: None
            continue
        if p.metavar is not None:
            continue
        if getattr(p, "is_flag", False) or getattr(p, "is_bool_flag", False):
            p.metavar = ""
        elif p.opts and str(p.opts[0]).startswith("--"):
            p.metavar = str(p.opts[0])[2:].upper().replace("-", "_")


# Options the paper reproductions share (one declaration, so their bounds and help agree).
WorkersOpt = Annotated[
    int | None, bounded(Workers, "--workers", help="Parallel processes (default: cores).")
]
WorkloadSeedOpt = Annotated[int, bounded(Seed, "--seed", help="Workload seed.")]
