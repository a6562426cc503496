"""CLI commands: serve (registered on import by ``sloserve.cli``).

``sloserve serve`` runs the OpenAI-compatible gateway (:mod:`sloserve.serve.api`) in front
of the emulated backend (replicas of the simulation engine in wall-clock time) or of real
OpenAI-compatible upstream engines. FastAPI and uvicorn load only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sloserve.cli._app import _build_config, app, err_console
from sloserve.cli._bounded import bounded
from sloserve.cli._cluster import _cluster_config
from sloserve.cli._options import _INSTANCE_FLAGS, ConfigOpt, _with_flags
from sloserve.cli.execute import DeviceOpt, DtypeOpt, ModelSpecOpt
from sloserve.config import read_yaml
from sloserve.core.bounds import Temperature
from sloserve.core.errors import ConfigError

_SERVE_INSTANCE_FLAGS = tuple(f for f in _INSTANCE_FLAGS if f != "horizon")


def parse_length(spec: str) -> dict[str, Any]:
    """``fixed:N``, ``uniform:LOW:HIGH`` or ``lognormal:MEAN:STD[:MAX]`` as a LengthDist dict."""
    kind, *args = spec.split(":")
    try:
        nums = [float(a) for a in args]
    except ValueError:
        nums = []
    shapes = {"fixed": (1,), "uniform": (2,), "lognormal": (2, 3)}
    if kind not in shapes or len(nums) not in shapes[kind] or len(nums) != len(args):
        raise ConfigError(
            f"--output-length {spec!r}: expected fixed:N, uniform:LOW:HIGH or "
            "lognormal:MEAN:STD[:MAX]"
        )
    if kind == "fixed":
        return {"kind": "fixed", "value": int(nums[0])}
    if kind == "uniform":
        return {"kind": "uniform", "low": int(nums[0]), "high": int(nums[1])}
    out: dict[str, Any] = {"kind": "lognormal", "mean": nums[0], "std": nums[1]}
    if len(nums) == 3:
        out["max"] = int(nums[2])
    return out


def _upstream_backend(
    upstreams: list[str], config: Path | None, served_model_name: str | None,
    options: dict[str, Any],
) -> Any:  # fmt: skip
    """The ``openai`` backend: ``--config`` (a YAML mapping of ``UpstreamConfig`` fields)
    first, then every flag the user set on top of it; what neither sets keeps
    ``UpstreamConfig``'s default."""
    from pydantic import ValidationError

    from sloserve.config import validation_message
    from sloserve.serve.upstream import OpenAIUpstreamBackend
    from sloserve.serve.upstream_config import UpstreamConfig

    data: dict[str, Any] = _yaml_mapping(config) if config is not None else {}
    data.update({k: v for k, v in options.items() if v is not None})
    if upstreams:
        data["upstreams"] = tuple(upstreams)
    if served_model_name:
        data["models"] = (served_model_name,)
    if not data.get("upstreams"):
        raise ConfigError("--backend openai needs at least one --upstream URL")
    try:
        cfg = UpstreamConfig(**data)
    except ValidationError as e:
        raise ConfigError(validation_message(e, "serve options")) from None
    return OpenAIUpstreamBackend(cfg)


def _yaml_mapping(path: Path) -> dict[str, Any]:
    import yaml

    from sloserve.core import yamlload

    try:
        data = yamlload.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--config {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of upstream options")
    return data


@app.command("serve")
@_with_flags(*_SERVE_INSTANCE_FLAGS)
def serve(
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            help="emulated (engine replicas), openai (proxy) or local (a real model here).",
        ),
    ] = "emulated",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8000,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Emulated: model name from the catalog (llama-2-7b); local: a Llama "
            "checkpoint directory.",
        ),
    ] = None,
    model_spec: ModelSpecOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    temperature: Annotated[
        float,
        bounded(Temperature, "--temperature", help="Local: sampling temperature (0: greedy)."),
    ] = 0.0,
    gpu: Annotated[str, typer.Option("--gpu", help="Emulated: GPU name from the catalog.")] = (
        "a100-80gb"
    ),
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            help="Emulated: engine replicas (1; or the count of the YAML's one cluster group).",
        ),
    ] = None,
    policy: Annotated[
        str | None, typer.Option("--policy", help="Emulated: per-instance policy (default vllm).")
    ] = None,
    router: Annotated[
        str | None,
        typer.Option(
            "--router",
            help="A cluster router (see `sloserve routers`; --plugin adds yours): "
            "least-loaded (default), round-robin, least-outstanding, power-of-two, slo-aware…",
        ),
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(
            "--time-scale", help="Emulated: simulated seconds per wall second (>1: faster)."
        ),
    ] = 1.0,
    output_length: Annotated[
        str | None,
        typer.Option(
            "--output-length",
            help="Emulated: output lengths fixed:N, uniform:LOW:HIGH or lognormal:MEAN:STD[:MAX] "
            "(capped by max_tokens; default: max_tokens).",
        ),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="Model name clients must send.")
    ] = None,
    max_queue: Annotated[
        int | None, typer.Option("--max-queue", help="Waiting requests before 429 queue_full.")
    ] = None,
    upstream: Annotated[
        list[str] | None, typer.Option("--upstream", help="Openai: an engine's base URL (repeat).")
    ] = None,
    admission: Annotated[
        str | None,
        typer.Option(
            "--admission",
            help="429 policy: none, queue (the default: 429 at --max-queue; emulated: no cap "
            "unless --max-queue is set; openai: 1024) or slo (also refuse real-time requests "
            "whose TTFT target or deadline can no longer be met).",
        ),
    ] = None,
    order: Annotated[
        str | None, typer.Option("--order", help="Openai: gateway queue order fcfs, priority, edf.")
    ] = None,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", help="Openai: requests per upstream at once.")
    ] = None,
    retries: Annotated[
        int | None,
        typer.Option("--retries", help="Openai: extra attempts before the first token (2)."),
    ] = None,
    breaker_failures: Annotated[
        int | None,
        typer.Option(
            "--breaker-failures", help="Openai: consecutive failures that open a breaker (3)."
        ),
    ] = None,
    breaker_open_s: Annotated[
        float | None,
        typer.Option("--breaker-open-s", help="Openai: seconds a breaker stays open (5)."),
    ] = None,
    health_interval_s: Annotated[
        float | None,
        typer.Option(
            "--health-interval-s", help="Openai: seconds between health checks/scrapes (2; 0 off)."
        ),
    ] = None,
    health_timeouts: Annotated[
        int | None,
        typer.Option(
            "--health-timeouts",
            help="Openai: timed-out health checks in a row that mark an upstream down (3).",
        ),
    ] = None,
    connect_timeout_s: Annotated[
        float | None,
        typer.Option("--connect-timeout-s", help="Openai: upstream connect timeout (2)."),
    ] = None,
    read_timeout_s: Annotated[
        float | None,
        typer.Option("--read-timeout-s", help="Openai: longest upstream silence (60)."),
    ] = None,
    queue_timeout_s: Annotated[
        float | None,
        typer.Option("--queue-timeout-s", help="Openai: longest wait in the gateway queue (60)."),
    ] = None,
    forward_priority: Annotated[
        bool | None,
        typer.Option(
            "--forward-priority/--no-forward-priority",
            help="Openai: send priority to the engines (vLLM priority scheduling; off).",
        ),
    ] = None,
    forward_slo: Annotated[
        bool | None,
        typer.Option(
            "--forward-slo/--no-forward-slo",
            help="Openai: send request_class/slo/qoe to sloserve upstreams (off).",
        ),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict/--lenient",
            help="Unknown body fields: 400, or name them in x-sloserve-ignored-params "
            "(emulated: dropped) / x-sloserve-forwarded-params (openai: passed on).",
        ),
    ] = False,
    slo_preset: Annotated[
        str, typer.Option("--slo-preset", help="Per-class SLO defaults: bros, qlm, none.")
    ] = "bros",
    objectives: Annotated[
        Path | None,
        typer.Option(
            "--objectives",
            metavar="FILE.yaml",
            help="Named objectives for x-gateway-inference-objective: name -> {priority, "
            "ttft_ms, tpot_ms} (priority: higher first, below zero sheddable).",
        ),
    ] = None,
    default_max_tokens: Annotated[
        int, typer.Option("--default-max-tokens", help="Chat max_tokens when a request has none.")
    ] = 256,
    pacing: Annotated[
        bool, typer.Option("--pacing", help="Pace each stream at its qoe.tokens_per_s.")
    ] = False,
    drain_timeout: Annotated[
        float, typer.Option("--drain-timeout", help="Shutdown: seconds to let streams finish.")
    ] = 30.0,
    request_read_timeout_s: Annotated[
        float,
        typer.Option(
            "--request-read-timeout-s",
            help="A request's headers, then its body, must arrive within this (408 after).",
        ),
    ] = 30.0,
    max_body_bytes: Annotated[
        int, typer.Option("--max-body-bytes", help="Largest request body (413 above).")
    ] = 32 * 2**20,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Openai: gateway processes on the one port (each with its own queue, "
            "breakers and router; metrics summed).",
        ),
    ] = 1,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed of output lengths and routers (0).")
    ] = None,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            help="uvicorn log level (warning hides access logs); info also logs one line per "
            "request (logger sloserve.serve).",
        ),
    ] = "warning",
    config: ConfigOpt = None,
    *,
    flags: dict[str, Any],
) -> None:
    """Serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions) with a policy."""
    from pydantic import ValidationError

    from sloserve.config import validation_message
    from sloserve.serve.api import GatewaySettings
    from sloserve.serve.objectives import load_objectives

    named = load_objectives(objectives) if objectives is not None else {}
    try:
        settings = GatewaySettings(
            strict=strict, slo_preset=slo_preset, objectives=named,
            default_max_tokens=default_max_tokens, pacing=pacing, drain_timeout_s=drain_timeout,
            request_read_timeout_s=request_read_timeout_s, max_body_bytes=max_body_bytes,
            workers=workers,
        )  # fmt: skip
    except ValidationError as e:
        raise ConfigError(validation_message(e, "serve options")) from None
    if backend in ("emulated", "local") and workers > 1:
        raise ConfigError(
            f"--workers {workers} needs --backend openai: the {backend} backend's engines live "
            "in one process (run it with --workers 1)"
        )
    if backend != "local" and model_spec is not None:
        raise ConfigError("--model-spec is for --backend local")
    if backend == "local":
        be = _local_backend(
            config, flags, model, model_spec, device, dtype, temperature, gpu, replicas,
            policy, time_scale, output_length, served_model_name, max_queue, seed or 0,
            admission,
        )  # fmt: skip
        what = (
            f"local {be.loaded.name} on {be.loaded.model.device}, policy {be.config.policy}, "
            f"model {be.model_name!r}"
        )
    elif backend == "emulated":
        be = _emulated_backend(
            config, flags, model or "llama-2-7b", gpu, replicas, policy, router, time_scale,
            output_length, served_model_name, max_queue, seed or 0, admission,
        )  # fmt: skip
        ccfg = be.cluster_config
        what = (
            f"emulated {be.config.instance.profile} x{ccfg.num_replicas}, policy "
            f"{be.config.policy}, router {ccfg.router}, model {be.model_name!r}"
        )
    elif backend == "openai":
        given = {
            "router": router, "admission": admission, "order": order, "max_queue": max_queue,
            "max_concurrency": max_concurrency, "seed": seed, "profile": flags.get("profile"),
            "retries": retries, "breaker_failures": breaker_failures,
            "breaker_open_s": breaker_open_s, "health_interval_s": health_interval_s,
            "health_timeouts": health_timeouts,
            "connect_timeout_s": connect_timeout_s, "read_timeout_s": read_timeout_s,
            "queue_timeout_s": queue_timeout_s, "forward_priority": forward_priority,
            "forward_slo": forward_slo,
        }  # fmt: skip
        if replicas is not None:
            raise ConfigError("--replicas is for --backend emulated (openai: --upstream URLs)")
        be = _upstream_backend(upstream or [], config, served_model_name, given)
        what = f"upstreams {', '.join(be.config.upstreams)}, router {be.config.router}"
    else:
        raise ConfigError(f"unknown --backend {backend!r}; choose emulated, openai or local")
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be 1..65535, got {port}")

    import uvicorn

    from sloserve.serve.api import create_app
    from sloserve.serve.server import GatewayServer, log_config, server_options

    if workers > 1:
        from sloserve.serve.server import run_workers

        err_console.print(f"sloserve serve: {what}, {workers} workers on http://{host}:{port}/v1")
        run_workers(settings, be.config, host, port, log_level)
        return
    err_console.print(f"sloserve serve: {what} on http://{host}:{port}/v1")
    server_config = uvicorn.Config(
        create_app(be, settings),
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config(log_level),  # with the gateway's request log
        # a backstop: the gateway itself ends what is left after --drain-timeout
        timeout_graceful_shutdown=int(drain_timeout) + 5,
        **server_options(),  # uvloop and httptools when installed
    )
    GatewayServer(server_config).run()


def _emulated_backend(
    config: Path | None, flags: dict[str, Any], model: str, gpu: str, replicas: int | None,
    policy: str | None, router: str | None, time_scale: float, output_length: str | None,
    served_model_name: str | None, max_queue: int | None, seed: int, admission: str | None,
) -> Any:  # fmt: skip
    """The emulated cluster: the YAML's ``cluster:`` section (as ``simulate`` reads it) with
    --replicas and --router on top; the gateway's default router is ``least-loaded``."""

    from sloserve.costmodel.profile import load_profile
    from sloserve.serve.emulated import EmulatedBackend

    if flags.get("profile") is None:
        flags = {**flags, "profile": f"{model}@{gpu}"}
        # Clients name the model as the user did on the command line.
        served_model_name = served_model_name or model
    sim, _policies = _build_config({}, config, flags)
    load_profile(sim.instance.profile)  # an unknown model or GPU fails here, with the list
    section = read_yaml(config).get("cluster") if config is not None else None
    if router is None and not (isinstance(section, dict) and "router" in section):
        router = "least-loaded"
    yaml_router = section.get("router") if isinstance(section, dict) else None
    cluster, _routers = _cluster_config(config, replicas, router, single=True)
    if cluster is not None and router not in (None, yaml_router) and yaml_router is not None:
        # --router replaced the YAML's router: its router_params were that one's
        cluster = cluster.model_copy(update={"router_params": {}})
    cfg = _emulated_config(
        sim, policy, seed, max_queue, served_model_name, admission,
        cluster=cluster, time_scale=time_scale,
        output_length=parse_length(output_length) if output_length else None,
    )  # fmt: skip
    return EmulatedBackend(cfg)


def _emulated_config(
    sim: Any, policy: str | None, seed: int, max_queue: int | None,
    served_model_name: str | None, admission: str | None, **extra: Any,
) -> Any:  # fmt: skip
    """The emulated (and local) backend's config from the resolved run config and the
    serve options; a validation error is one line naming the option."""
    from pydantic import ValidationError

    from sloserve.config import validation_message
    from sloserve.serve.emulated_config import EmulatedConfig

    try:
        return EmulatedConfig(
            instance=sim.instance,
            policy=policy or sim.policy,
            policy_params=sim.policy_params,
            seed=seed,
            max_queue=max_queue,
            served_model_name=served_model_name,
            admission=admission or "queue",
            **extra,
        )
    except ValidationError as e:
        raise ConfigError(validation_message(e, "serve options")) from None


def _local_backend(
    config: Path | None, flags: dict[str, Any], model: str | None, model_spec: str | None,
    device: str, dtype: str | None, temperature: float, gpu: str, replicas: int | None,
    policy: str | None, time_scale: float, output_length: str | None,
    served_model_name: str | None, max_queue: int | None, seed: int, admission: str | None,
) -> Any:  # fmt: skip
    """The local backend: the model (``--model PATH`` or ``--model-spec``) behind one
    replica of ``--policy``. The profile (``--profile``, else the spec's catalog model, else
    llama-2-7b, on ``--gpu``) gives the policy its cost model. Options are checked before
    the weights load."""

    from sloserve.cli.execute import load
    from sloserve.costmodel.profile import load_profile
    from sloserve.serve.local import LocalBackend

    if model is None and model_spec is None:
        raise ConfigError("--backend local needs --model PATH (a checkpoint) or --model-spec NAME")
    if replicas not in (None, 1):
        raise ConfigError(f"--replicas {replicas}: the local backend runs one replica")
    if time_scale != 1.0:
        raise ConfigError(f"--time-scale {time_scale}: the local backend runs in real time")
    if output_length is not None:
        raise ConfigError("--output-length: the local model ends its outputs (EOS, max_tokens)")
    if flags.get("profile") is None:
        catalog = model_spec if model_spec not in (None, "tiny") else "llama-2-7b"
        flags = {**flags, "profile": f"{catalog}@{gpu}"}
    sim, _policies = _build_config({}, config, flags)
    load_profile(sim.instance.profile)  # an unknown model or GPU fails here, with the list
    cfg = _emulated_config(sim, policy, seed, max_queue, served_model_name, admission)
    return LocalBackend(cfg, load(model_spec, model, device, dtype), temperature=temperature)
