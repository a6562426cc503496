"""The prefix-caching flags of simulate, compare and serve (``engine/prefix_cache.py``).

``--prefix-caching/--no-prefix-caching`` (on by default, as in vLLM; vLLM's spelling
``--enable-prefix-caching/--no-enable-prefix-caching`` is a hidden alias, ``cli/_vllm.py``)
and ``--cpu-cache-gib``, the host memory that keeps cached KV evicted from the GPU."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sloserve.cli._bounded import bounded
from sloserve.core.bounds import GiB

PREFIX_OPTIONS: dict[str, Any] = {
    "prefix_caching": Annotated[
        bool | None,
        typer.Option(
            "--prefix-caching/--no-prefix-caching",
            # its own panel: the long flag pair would widen the main table past 80 columns
            rich_help_panel="Prefix caching",
            help="Reuse the cached KV of identical prompt prefixes (the trace's hash_ids); "
            "on by default (vLLM: --enable-prefix-caching).",
        ),
    ],
    "cpu_cache_gib": Annotated[
        float | None,
        bounded(
            GiB,
            "--cpu-cache-gib",
            metavar="GIB",
            rich_help_panel="Prefix caching",
            help="Host memory for prefix-cache blocks evicted from the GPU (0: none).",
        ),
    ],
}
PREFIX_PATHS: dict[str, tuple[str, ...]] = {
    "prefix_caching": ("instance", "prefix_caching"),
    "cpu_cache_gib": ("instance", "cpu_cache_gib"),
}
