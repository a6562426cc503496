"""vLLM's flag names on simulate, compare and serve, and the vLLM settings that need a
computation (KV blocks, tensor parallelism, chunked prefill, burstiness).

Plain renames (``--max-num-seqs`` is ``--max-running``) are hidden options whose value goes
to the native flag; :func:`merge_alias_flags` refuses two names with different values. The
derived settings are resolved by :func:`resolve_derived` once the YAML file and the flags are
merged, so that every value they depend on (the block size, the profile) is final."""

from __future__ import annotations

import math
from typing import Annotated, Any, get_args

import typer
from pydantic import Field

from sloserve.cli._bounded import bounded
from sloserve.core.bounds import Count, Degree, Fraction, Rate, Tokens
from sloserve.core.errors import ConfigError

# cv of gamma gaps is bounded to [1e-3, 100] (workloads/arrivals.py), so B = 1/cv² to [1e-4, 1e6]
Burstiness = Annotated[float, Field(ge=1e-4, le=1e6, allow_inf_nan=False)]


def _hidden(decl: str, kind: Any) -> Any:
    # vLLM's spelling of a native flag: the native flag's help names it, so it is hidden
    base = int if get_args(kind)[0] is int else float
    return Annotated[base | None, bounded(kind, decl, help="", hidden=True)]


# vLLM's flags, added to the shared options of simulate, compare and serve (cli/_options.py);
# hidden: the help of the native flag each one sets names it, so `--help` still fits 80 columns
VLLM_OPTIONS: dict[str, Any] = {
    "max_num_seqs": _hidden("--max-num-seqs", Count),
    "max_num_batched_tokens": _hidden("--max-num-batched-tokens", Tokens),
    "gpu_memory_utilization": _hidden("--gpu-memory-utilization", Fraction),
    "long_prefill_token_threshold": _hidden("--long-prefill-token-threshold", Tokens),
    "request_rate": _hidden("--request-rate", Rate),
    "num_prompts": _hidden("--num-prompts", Count),
    "num_gpu_blocks_override": Annotated[
        int | None,
        bounded(
            Count,
            "--num-gpu-blocks-override",
            hidden=True,
            metavar="BLOCKS",
            help="vLLM's KV capacity in blocks: M = BLOCKS × --block-size tokens.",
        ),
    ],
    "tensor_parallel_size": Annotated[
        int | None,
        bounded(
            Degree,
            "--tensor-parallel-size",
            hidden=True,
            metavar="TP",
            help="vLLM's TP: a MODEL@GPU profile becomes MODEL@GPUxTP (the default "
            "profile's model and GPU if none is given); a profile that fixes another TP is "
            "an error.",
        ),
    ],
    "enable_prefix_caching": Annotated[
        bool | None,
        typer.Option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            hidden=True,
            help="vLLM's spelling of --prefix-caching/--no-prefix-caching.",
        ),
    ],
    "enable_chunked_prefill": Annotated[
        bool | None,
        typer.Option(
            "--enable-chunked-prefill/--no-enable-chunked-prefill",
            hidden=True,
            help="vLLM: off runs each prefill whole (P = C); on keeps P (--chunk-size).",
        ),
    ],
    "burstiness": Annotated[
        float | None,
        bounded(
            Burstiness,
            "--burstiness",
            hidden=True,
            metavar="B",
            help="vllm bench serve: gamma arrivals with cv = 1/sqrt(B) (1 = Poisson).",
        ),
    ],
}

# hidden vLLM flag (parameter name) -> the native flag it spells
FLAG_ALIASES: dict[str, str] = {
    "max_num_seqs": "max_running",
    "max_num_batched_tokens": "max_batch_tokens",
    "gpu_memory_utilization": "kv_utilization",
    "long_prefill_token_threshold": "chunk_size",
    "request_rate": "rate",
    "num_prompts": "num_requests",
    "enable_prefix_caching": "prefix_caching",
}
# derived vLLM flag -> (config path it is kept at until resolved, the native flag it rivals)
DERIVED_FLAGS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "num_gpu_blocks_override": (("instance", "num_gpu_blocks_override"), "kv_capacity"),
    "tensor_parallel_size": (("instance", "tensor_parallel_size"), None),
    "enable_chunked_prefill": (("instance", "enable_chunked_prefill"), "chunk_size"),
    "burstiness": (("workload", "burstiness"), "cv"),
}
# the config key a native rival flag sets, inside the same section as the derived key
_RIVAL_KEY = {"kv_capacity": "kv_capacity_tokens", "chunk_size": "chunk_size", "cv": "cv"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def merge_alias_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """``flags`` with each vLLM alias folded into its native flag; both with different
    values is an error."""
    out = dict(flags)
    for alias, native in FLAG_ALIASES.items():
        value = out.pop(alias, None)
        if value is None:
            continue
        if out.get(native) is not None and out[native] != value:
            raise ConfigError(
                f"{_flag(alias)} {value} contradicts {_flag(native)} {out[native]}; "
                "they are the same setting, give one of them"
            )
        out[native] = value
    return out


def drop_overridden(data: dict[str, Any], flags: dict[str, Any]) -> None:
    """A flag overrides the YAML file, also across names: ``--kv-capacity`` drops the file's
    ``num_gpu_blocks_override`` and ``--num-gpu-blocks-override`` the file's
    ``kv_capacity_tokens`` (likewise chunked prefill vs chunk size, burstiness vs cv)."""
    for name, (path, rival) in DERIVED_FLAGS.items():
        if rival is None:
            continue
        section = data.get(path[0])
        if not isinstance(section, dict):
            continue
        rival_key = _RIVAL_KEY[rival]
        holder = section.get("arrival") if rival == "cv" else section
        if flags.get(name) is not None and flags.get(rival) is None and isinstance(holder, dict):
            holder.pop(rival_key, None)
        if flags.get(rival) is not None and flags.get(name) is None:
            section.pop(path[-1], None)


def resolve_derived(data: dict[str, Any], source: str) -> None:
    """Turn the derived vLLM settings in ``data`` into sloserve's keys, in place."""
    from sloserve.experiments.runner import InstanceConfig

    instance = data.get("instance")
    if isinstance(instance, dict):
        blocks = instance.pop("num_gpu_blocks_override", None)
        if blocks is not None:
            block = instance.get("block_size", InstanceConfig.model_fields["block_size"].default)
            if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 1:
                raise ConfigError(
                    f"{source}: num_gpu_blocks_override must be a whole number ≥ 1 (got {blocks!r})"
                )
            tokens = blocks * int(block)
            old = instance.get("kv_capacity_tokens")
            if old is not None and old != tokens:
                raise ConfigError(
                    f"{source}: num_gpu_blocks_override {blocks} × block_size {block} = "
                    f"{tokens} tokens contradicts kv_capacity_tokens {old}; give one of them"
                )
            instance["kv_capacity_tokens"] = tokens
        chunked = instance.pop("enable_chunked_prefill", None)
        if chunked is False:
            # vLLM without chunked prefill runs a prompt's whole prefill in one step, up to the
            # token budget: P = C.
            if instance.get("chunk_size") is not None:
                raise ConfigError(
                    f"{source}: enable_chunked_prefill is off but chunk_size "
                    f"(long_prefill_token_threshold) is {instance['chunk_size']}; give one"
                )
            budget = instance.get(
                "max_batch_tokens", InstanceConfig.model_fields["max_batch_tokens"].default
            )
            instance["chunk_size"] = budget
        tp = instance.pop("tensor_parallel_size", None)
        if tp is not None:
            instance["profile"] = profile_for_tp(instance.get("profile"), tp, source)
    workload = data.get("workload")
    if isinstance(workload, dict) and workload.get("burstiness") is not None:
        _burstiness(workload, workload.pop("burstiness"), source)


def _burstiness(workload: dict[str, Any], b: Any, source: str) -> None:
    # vLLM bench serve: gamma gaps with shape = burstiness, so cv = 1/sqrt(burstiness).
    if not isinstance(b, (int, float)) or isinstance(b, bool) or not 0 < b <= 1e6:
        raise ConfigError(f"{source}: burstiness must be a number > 0 and ≤ 1e6 (got {b!r})")
    arrival = dict(workload.get("arrival") or {})
    kind = arrival.get("kind", "gamma")
    if kind not in ("gamma", "poisson") or (kind == "poisson" and b != 1):
        raise ConfigError(
            f"{source}: burstiness {b} needs gamma arrivals (vLLM's definition), "
            f"not arrival {kind!r}"
        )
    cv = 1 / math.sqrt(b)
    if arrival.get("cv") is not None and not math.isclose(arrival["cv"], cv, rel_tol=1e-9):
        raise ConfigError(
            f"{source}: burstiness {b} means cv {cv:g} (cv = 1/sqrt(burstiness)) but cv is "
            f"{arrival['cv']}; give one of them"
        )
    if kind == "gamma":
        arrival["cv"] = cv
    arrival["kind"] = kind
    workload["arrival"] = arrival


def profile_for_tp(profile: Any, tp: Any, source: str) -> str:
    """The profile name for ``--tensor-parallel-size``: ``MODEL@GPU`` becomes
    ``MODEL@GPUxTP``; a name that already fixes a TP (``MODEL@GPUxN``, or a built-in
    profile) must agree with it; no profile given means the default profile's model and GPU
    at this TP."""
    from sloserve.costmodel.profile import TP_SUFFIX, load_profile, parse_spec_name
    from sloserve.experiments.runner import InstanceConfig

    if not isinstance(tp, int) or isinstance(tp, bool) or not 1 <= tp <= 1024:
        raise ConfigError(f"{source}: tensor_parallel_size must be 1 to 1024 (got {tp!r})")
    if profile is None:
        default = load_profile(InstanceConfig.model_fields["profile"].default)
        if default.tp == tp:
            return str(InstanceConfig.model_fields["profile"].default)
        return f"{default.model.name}@{default.gpu.name}x{tp}"
    name = str(profile)
    spec = name.split(":", 1)[-1] if name.startswith("roofline:") else name
    parsed = parse_spec_name(spec) if "@" in spec else None
    if parsed is not None:
        given = parsed[2]
        # an explicit "xN" suffix fixes the TP (N = 1 included); MODEL@GPU leaves it open
        has_tp = given != 1 or TP_SUFFIX.match(spec.split("@", 1)[1]) is not None
        if has_tp and given != tp:
            raise ConfigError(
                f"{source}: tensor_parallel_size {tp} contradicts profile {name!r} (TP {given})"
            )
        return name if has_tp else f"{name}x{tp}"
    found = load_profile(name).tp
    if found != tp:
        raise ConfigError(
            f"{source}: tensor_parallel_size {tp} contradicts profile {name!r} (TP {found}); "
            "name a profile MODEL@GPU and the TP is taken from the flag"
        )
    return name
