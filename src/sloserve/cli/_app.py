"""The ``sloserve`` typer app, the merge of options into a config, and ``main``.

``app`` and ``reproduce_app`` (the ``reproduce`` group, shared by the papers' commands) live
here with the merge of built-in defaults, a YAML file and the shared workload/instance
flags (declared in :mod:`sloserve.cli._options`) into a ``SimConfig``
(:func:`_build_config`). Every
command family lives in a module beside this file and registers on ``app`` /
``reproduce_app`` when ``sloserve.cli`` imports it. Every error a user can cause ends as one
line on stderr and exit status 2 (``main``)."""

from __future__ import annotations

import atexit
import copy
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from sloserve.cli._bounded import _field_at, default_text, polish_params
from sloserve.cli._console import lazy_console
from sloserve.cli._options import _DEFAULT_RATE, _FLAG_OPTIONS, _FLAG_PATHS, WorkloadOpt
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
from sloserve.core.process_freeze import freeze_at_exit, release_import

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

    # The import's freeze ends where a command starts (cli/__init__.py: its garbage is
    # the collector's again; a long-lived `serve` must not keep it for its life).
    release_import()

    load_plugins(plugin or ())


# Wide enough for the comparison table when output goes to a file or a CI log; built on
# first use (cli/_console.py: a --json run never imports rich's console).
console = lazy_console(width=140)
err_console = lazy_console(stderr=True, width=400)


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


def _narrowed(args: list[str]) -> typer.Typer:
    """``app`` with only the command ``args`` names, when it names one: click builds every
    command's options on each run (≈ 40 ms for two dozen commands), and a run needs one.
    Anything else (no command, a root option first, a group, an unknown or misspelled
    name, ``--help`` listing the commands) gets the whole app. It relies on typer's
    internals (``Typer.registered_commands``/``registered_groups``, a shallow
    ``copy.copy`` of the app), checked with typer 0.29.2 (click 8.5.1);
    ``tests/test_cli_help.py::test_narrowed_app_help_is_the_whole_apps`` fails if that
    changes."""
    if not args or args[0].startswith("-"):
        return app
    for info in app.registered_commands:
        name = info.name or (
            typer.main.get_command_name(info.callback.__name__) if info.callback else None
        )
        if name == args[0]:
            only = copy.copy(app)
            only.registered_commands = [info]
            only.registered_groups = []
            return only
    return app


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors become one line and exit status 2.

    Click runs with ``standalone_mode=False`` so that its usage errors (a bad value, an
    unknown option or command, a missing argument) reach us as exceptions and get the same
    one line as every other mistake, instead of click's multi-line box."""
    # typer vendors click; its exceptions are the ones a typer command raises
    from typer._click import exceptions as click

    # The shutdown's full collections over what the command leaves (a run: ≈ 90 ms of
    # CPU) free nothing the operating system does not take back (core/process_freeze.py).
    atexit.unregister(freeze_at_exit)  # once, however often main runs in one process
    atexit.register(freeze_at_exit)
    args = sys.argv[1:] if argv is None else argv
    if not args or any(a in ("--help", "-h") for a in args):
        add_bound_help()
    command = typer.main.get_command(_narrowed(args))
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
