"""InferMax's named schedulers: Table 1's presets of the unified scheduler (§4.1 of
``papers/infermax.txt``), their eviction-free ``-ef`` variants (§4.3), EDF and the A.3
ranking schedulers (``rank-input``, ``rank-output``).

:data:`PRESETS` is the table ``(name, factory, summary)`` that
:mod:`sloserve.policies.registry` registers (this module does not import the registry, so
there is no import cycle). A factory takes the policy parameters (any
:class:`~sloserve.policies.infermax.unified.UnifiedConfig` field) that override the preset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.engine.interface import PreemptionMode, Scheduler
from sloserve.policies.infermax.unified import UnifiedConfig, UnifiedScheduler

PresetFactory = Callable[[Mapping[str, Any]], Scheduler]


def _unified(name: str, base: UnifiedConfig) -> PresetFactory:
    fields = {f.name for f in dataclasses.fields(UnifiedConfig)}

    def factory(params: Mapping[str, Any]) -> Scheduler:
        unknown = sorted(set(params) - fields)
        if unknown:
            raise ConfigError(
                f"policy {name!r}: unknown parameter(s) {', '.join(unknown)}; "
                f"valid: {', '.join(sorted(fields))}"
            )
        p = dict(params)
        if "preemption_mode" in p:
            p["preemption_mode"] = PreemptionMode.parse(p["preemption_mode"], name)
        try:
            cfg = dataclasses.replace(base, **p)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"policy {name!r}: {e}") from e
        return UnifiedScheduler(name, cfg)

    return factory


# InferMax Table 1, P column: vLLM-style presets use P = C (None).
_TABLE1: dict[str, tuple[UnifiedConfig, str]] = {
    "vllm": (
        UnifiedConfig("prefill-first", hybrid=False, chunked_prefill=False),
        "vLLM: prefill priority, no hybrid, no chunking",
    ),
    "sarathi": (
        UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True, prefill_tokens=512),
        "Sarathi-Serve: decode priority, hybrid batches, chunked prefill P=512",
    ),
    "sarathi-p=c": (
        UnifiedConfig("decode-first", hybrid=True, chunked_prefill=True),
        "Sarathi with P = C",
    ),
    "sarathi-nocp": (
        UnifiedConfig("decode-first", hybrid=True, chunked_prefill=False),
        "Sarathi without chunked prefill",
    ),
    "vllm-hy": (
        UnifiedConfig("prefill-first", hybrid=True, chunked_prefill=False),
        "vLLM with hybrid batching",
    ),
    "sarathi-nohy": (
        UnifiedConfig("decode-first", hybrid=False, chunked_prefill=False),
        "Sarathi without hybrid batching or chunking",
    ),
}


def _presets() -> list[tuple[str, PresetFactory, str]]:
    out: list[tuple[str, PresetFactory, str]] = []
    for name, (cfg, summary) in _TABLE1.items():
        out.append((name, _unified(name, cfg), summary))
        out.append(
            (
                f"{name}-ef",
                _unified(f"{name}-ef", dataclasses.replace(cfg, eviction_free=True, evict=False)),
                f"{summary}; eviction-free (reserves I+O-1 per request)",
            )
        )
    out += [
        (
            "edf",
            _unified(
                "edf",
                UnifiedConfig(
                    "single",
                    hybrid=True,
                    chunked_prefill=True,
                    prefill_tokens=512,
                    order="edf",
                    evict_for_waiting=True,
                ),
            ),
            "earliest deadline first over all requests (Sarathi batching, preemptive)",
        ),
        (
            "rank-input",
            _unified(
                "rank-input",
                UnifiedConfig(
                    "single",
                    hybrid=True,
                    chunked_prefill=True,
                    prefill_tokens=512,
                    order="input",
                    evict_for_waiting=True,
                ),
            ),
            "InferMax A.3: shortest input first (Sarathi batching, preemptive)",
        ),
        (
            "rank-output",
            _unified(
                "rank-output",
                UnifiedConfig(
                    "single",
                    hybrid=True,
                    chunked_prefill=True,
                    prefill_tokens=512,
                    order="output",
                    evict_for_waiting=True,
                ),
            ),
            "InferMax A.3: shortest predicted output first (Sarathi batching, preemptive)",
        ),
    ]
    return out


PRESETS: tuple[tuple[str, PresetFactory, str], ...] = tuple(_presets())
"""Every preset as ``(name, factory, summary)``, in registration order."""
