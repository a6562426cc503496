"""Other papers' batch-time formulas as :class:`LinearCoefficients` (BROS, Aladdin).

BROS and Aladdin as special cases
---------------------------------
BROS prices a batch as ``α0·Ln + α1·Ln·La + β``, one fit for prefill requests and one for
decode requests, summed. ``Ln·La`` is the size of the attention score matrix; a batch's
attention is block-diagonal, so we read it per request, ``Σ_i Ln_i·La_i`` (identical to the
paper's product for one request): for decode requests ``Σ 1·ctx = decode_context_sum``, for
prefill requests ``Σ c·(c + ctx) = prefill_attn_work`` (``c²`` without cache, the paper's
``La = Ln``). :func:`bros_coefficients` maps ``β_p → prefill_intercept``,
``β_d → decode_intercept``, ``α1_p → per_prefill_work``, ``α1_d → per_decode_kv``,
``α0_p → per_token`` and ``α0_d − α0_p → per_decode_seq`` (floor, intercepts of the
non-attention line and comm terms 0). Aladdin models prefill-only batches as ``k1·Σl + c1``
and decode-only batches as ``(k2·l̄ + c2)·b + c3 = k2·Σctx + c2·b + c3``;
:func:`aladdin_coefficients` maps ``k1 → per_token``, ``c1 → prefill_intercept``,
``k2 → per_decode_kv``, ``c2 − k1 → per_decode_seq``, ``c3 → decode_intercept`` (a hybrid
batch then costs the sum of both, as in BROS). Both are exact on every batch their own
formulas price, **provided the decode per-request slope is at least the prefill per-token
slope** (``α0_d ≥ α0_p``, ``c2 ≥ k1``): :class:`LinearCoefficients` has one per-token term
shared by prefill and decode tokens and no per-prefill-token term, so the converters raise
:class:`~sloserve.core.errors.ConfigError` otherwise rather than return a model that is not
the paper's. BROS's ``Mcpu`` (checkpointed blocks) is a transfer, priced by ``swap_time``.
"""

from __future__ import annotations

import math

from sloserve.core.errors import ConfigError
from sloserve.costmodel.linear import LinearCoefficients

# --------------------------------------------------------------------------- BROS / Aladdin


def _nonneg(source: str, **values: float) -> None:
    for k, v in values.items():
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"{source}: {k} must be a finite number >= 0, got {v}")


def bros_coefficients(
    *,
    prefill_alpha0: float,
    prefill_alpha1: float,
    prefill_beta: float,
    decode_alpha0: float,
    decode_alpha1: float,
    decode_beta: float,
) -> LinearCoefficients:
    """BROS's ``α0·Ln + α1·Ln·La + β`` (one fit for prefill, one for decode, summed).

    Exact on every batch (``Ln·La`` read per request, see the module docstring) provided
    ``decode_alpha0 >= prefill_alpha0``; otherwise :class:`ConfigError`.
    """
    _nonneg(
        "BROS cost model",
        prefill_alpha0=prefill_alpha0,
        prefill_alpha1=prefill_alpha1,
        prefill_beta=prefill_beta,
        decode_alpha0=decode_alpha0,
        decode_alpha1=decode_alpha1,
        decode_beta=decode_beta,
    )
    if decode_alpha0 < prefill_alpha0:
        raise ConfigError(
            f"BROS cost model: decode_alpha0 ({decode_alpha0}) < prefill_alpha0 "
            f"({prefill_alpha0}) is not representable: LinearCoefficients has one per-token "
            "term shared by prefill and decode tokens and no per-prefill-token term"
        )
    return LinearCoefficients(
        per_token=prefill_alpha0,
        per_decode_seq=decode_alpha0 - prefill_alpha0,
        per_decode_kv=decode_alpha1,
        decode_intercept=decode_beta,
        per_prefill_work=prefill_alpha1,
        prefill_intercept=prefill_beta,
    )


def aladdin_coefficients(
    *, k1: float, c1: float, k2: float, c2: float, c3: float
) -> LinearCoefficients:
    """Aladdin's prefill ``k1·Σl_in + c1`` and decode ``(k2·l_ave + c2)·b + c3``.

    Exact on prefill-only and decode-only batches (Aladdin prices no others; a hybrid batch
    costs the sum) provided ``c2 >= k1``; otherwise :class:`ConfigError`.
    """
    _nonneg("Aladdin cost model", k1=k1, c1=c1, k2=k2, c2=c2, c3=c3)
    if c2 < k1:
        raise ConfigError(
            f"Aladdin cost model: c2 ({c2}) < k1 ({k1}) is not representable: "
            "LinearCoefficients has one per-token term shared by prefill and decode tokens "
            "and no per-prefill-token term"
        )
    return LinearCoefficients(
        per_token=k1,
        prefill_intercept=c1,
        per_decode_kv=k2,
        per_decode_seq=c2 - k1,
        decode_intercept=c3,
    )
