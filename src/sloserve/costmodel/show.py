"""Data behind ``sloserve costmodel show``: a profile's headline numbers as a JSON-able dict.

:func:`show_profile` takes a profile (built-in, spec-built or from a file) and returns

* ``kind``: ``roofline`` for a profile built from specs, ``fitted`` for one fitted to
  measurements;
* ``kv``: M, the KV tokens that fit at the given memory utilisation, and the KV bytes per
  token;
* ``prefill``: seconds and tokens/s of one request's whole prefill of 512 and 2,048 tokens
  alone in a batch (Andes quotes ~5,000 prefill tokens/s for a 7B model on an A100);
* ``decode``: the decode-only step time (ms) for batch sizes 1..256 × contexts
  512/1,024/2,048/4,096 (every request reading the same context), with a parallel grid of
  whether that batch's KV fits in M;
* ``single_request_decode_ms``: the step time of one request per context (Aladdin's decode
  SLOs are 1.3× this);
* ``max_batch_for_tpot``: per context, the largest batch whose decode step meets the TPOT
  target (default 50 ms) *and* whose KV fits in M, and which of the two limits it;
* ``transfer``: KV swap time per 1,000 tokens and model load times from each tier.

Choice: "meets the TPOT target" means a decode-only iteration of ``b`` requests at that
context takes at most the target; prefill interference (chunked prefills sharing the
iteration) is not included. The search is exact (binary search on the monotone step time),
capped at ``max_batch`` (default 4,096).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.costmodel.profile import (
    ReplicaProfile,
    load_profile,
    single_request_decode_latency,
)
from sloserve.costmodel.transfer import kv_swap_time, load_times

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_CONTEXTS: tuple[int, ...] = (512, 1024, 2048, 4096)
DEFAULT_PREFILL_TOKENS: tuple[int, ...] = (512, 2048)
DEFAULT_TPOT_S = 0.05


def _r(v: float, nd: int = 4) -> float:
    return float(f"{v:.{nd}g}")


def max_batch_for_tpot(
    profile: ReplicaProfile,
    context: int,
    tpot_s: float,
    kv_tokens: int | None = None,
    max_batch: int = 4096,
) -> tuple[int, str]:
    """The largest decode batch at ``context`` whose step time is ≤ ``tpot_s`` and whose KV
    (``batch × context``) fits in ``kv_tokens`` (default: M at 0.9), and the binding limit
    (``"tpot"``, ``"kv"`` or ``"max_batch"``). 0 when even one request misses the target.
    """
    if context <= 0 or tpot_s <= 0:
        raise ValueError("context and tpot_s must be > 0")
    cm = profile.cost_model()
    m = profile.kv_capacity_tokens(0.9) if kv_tokens is None else kv_tokens
    kv_cap = m // context
    cap, limit = (kv_cap, "kv") if kv_cap < max_batch else (max_batch, "max_batch")

    def ok(b: int) -> bool:
        return cm.decode_time(b, b * context) <= tpot_s

    if cap <= 0 or not ok(1):
        return 0, ("kv" if cap <= 0 else "tpot")
    if ok(cap):
        return cap, limit
    lo, hi = 1, cap  # ok(lo), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, "tpot"


def show_profile(
    profile: ReplicaProfile,
    *,
    utilization: float = 0.9,
    prefill_tokens: Sequence[int] = DEFAULT_PREFILL_TOKENS,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    tpot_s: float = DEFAULT_TPOT_S,
) -> dict[str, Any]:
    """The ``costmodel show`` numbers of ``profile`` (see the module docstring)."""
    cm = profile.cost_model()
    m = profile.kv_capacity_tokens(utilization)
    prefill = []
    for t in prefill_tokens:
        s = cm.prefill_time(t)
        prefill.append({"tokens": t, "seconds": _r(s), "tokens_per_s": round(t / s, 1)})
    grid = [[_r(cm.decode_time(b, b * c) * 1e3) for c in contexts] for b in batch_sizes]
    fits = [[b * c <= m for c in contexts] for b in batch_sizes]
    tpot = []
    for c in contexts:
        b, limit = max_batch_for_tpot(profile, c, tpot_s, m)
        step = cm.decode_time(b, b * c) * 1e3 if b else None
        tpot.append(
            {
                "context": c,
                "max_batch": b,
                "limited_by": limit,
                "step_ms": None if step is None else _r(step),
            }
        )
    return {
        "profile": profile.name,
        "description": profile.description,
        "model": profile.model.name,
        "gpu": profile.gpu.name,
        "tp": profile.tp,
        "kind": profile.fit_report.get("kind", "fitted"),
        "source": profile.source,
        "kv": {
            "utilization": utilization,
            "capacity_tokens": m,
            "bytes_per_token": profile.kv_bytes_per_token,
        },
        "prefill": prefill,
        "decode": {
            "batch_sizes": list(batch_sizes),
            "contexts": list(contexts),
            "step_ms": grid,
            "fits_kv": fits,
        },
        "single_request_decode_ms": {
            str(c): _r(single_request_decode_latency(profile, c) * 1e3) for c in contexts
        },
        "max_batch_for_tpot": {"tpot_ms": _r(tpot_s * 1e3), "per_context": tpot},
        "transfer": {
            "kv_swap_ms_per_1k_tokens": _r(kv_swap_time(1000, profile) * 1e3),
            "model_load_s": {k: _r(v) for k, v in load_times(profile).items()},
        },
    }


def show(
    profile: str | None = None,
    *,
    model: str | None = None,
    gpu: str | None = None,
    tp: int = 1,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`show_profile` for ``--profile NAME`` or ``--model M --gpu G --tp N``.

    The model/GPU form resolves like ``load_profile("M@GxN")``: a calibrated built-in
    profile of that hardware when there is one, else the roofline profile from the specs.
    """
    if profile is not None:
        if model is not None or gpu is not None:
            raise ConfigError("give either a profile or a model and a GPU, not both")
        return show_profile(load_profile(profile), **kwargs)
    if model is None or gpu is None:
        raise ConfigError("give a profile, or both a model and a GPU")
    name = f"{model}@{gpu}" + (f"x{tp}" if tp != 1 else "")
    return show_profile(load_profile(name), **kwargs)
