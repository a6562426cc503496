"""What the gateway reads from a request besides its OpenAI body (FastAPI).

The request's class, priority, SLO and QoE by precedence: body, then the ``x-slo-*``
(``x-slo-ttft-ms``, ``x-slo-tpot-ms``, ``x-slo-e2e-ms``: the end-to-end deadline) and
``x-request-class`` headers, then the named objective of ``x-gateway-inference-objective``,
then the class defaults of the SLO preset (:func:`_slo_inputs`, see
:mod:`sloserve.serve.api`); the Gateway API Inference Extension's headers
(:func:`_gateway_inputs`); the ``class`` metric label of a
request refused early; the field that set the output cap; the header listing unknown
fields.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from fastapi import Request

from sloserve.core.request import SLO, QoESpec, RequestClass
from sloserve.serve.api_errors import _ApiError
from sloserve.serve.objectives import OBJECTIVE_NAME, Objective
from sloserve.serve.schemas import (
    MS_MAX,
    AnyRequest,
    ChatCompletionRequest,
)
from sloserve.workloads.rules import SLO_PRESETS

_HEADER_NAMES_MAX = 16


def _header_list(names: list[str]) -> str:
    """Field names for a response header: percent-encoded (headers are latin-1, names are
    any JSON string) and at most 16 of them (a body may carry thousands)."""
    shown = [quote(n, safe="-_.~") for n in names[:_HEADER_NAMES_MAX]]
    if len(names) > _HEADER_NAMES_MAX:
        shown.append(f"+{len(names) - _HEADER_NAMES_MAX} more")
    return ",".join(shown)


_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""A header number: plain decimal notation (no sign, ``inf``, ``nan``, ``0x…`` or ``1_000``,
which Python's ``float`` would read)."""


def _header(request: Request, name: str) -> str | None:
    """The value of header ``name``; sent several times, every copy must be the same
    (a proxy that appends a second, different target is a contradiction, not a choice)."""
    values = request.headers.getlist(name)
    if not values:
        return None
    if any(v.strip() != values[0].strip() for v in values[1:]):
        raise _ApiError(
            400, f"header {name} is sent {len(values)} times with different values",
            param=name, code="invalid_value",
        )  # fmt: skip
    return values[0].strip()


def _header_ms(request: Request, name: str) -> float | None:
    raw = _header(request, name)
    if raw is None:
        return None
    v = float(raw) if _DECIMAL.fullmatch(raw) else float("nan")
    if not 0 < v <= MS_MAX:
        raise _ApiError(
            400, f"header {name} must be a number of milliseconds in (0, {MS_MAX:.0f}], "
            f"got {raw[:40]!r}", param=name, code="invalid_value",
        )  # fmt: skip
    return v


def _class_label(request: Request, body: AnyRequest | None = None) -> str:
    """The ``class`` metric label of a request refused before it was fully read: its
    class as far as it can be told, ``rt`` otherwise (bounded: ``rt`` or ``be``)."""
    raw = (body.request_class if body is not None else None) or request.headers.get(
        "x-request-class", ""
    )
    v = raw.strip().lower()
    return v if v in ("rt", "be") else "rt"


OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
_FAIRNESS_ID = re.compile(r"[!-~]{1,256}")
"""A tenant id: 1-256 visible ASCII characters (no spaces)."""


def _gateway_inputs(
    request: Request, objectives: dict[str, Objective]
) -> tuple[Objective | None, str | None]:
    """The named objective and the fairness id of the Inference Extension's headers; 400
    for an objective the gateway does not know (strict, as the Kubernetes gateway is)."""
    name = _header(request, OBJECTIVE_HEADER)
    objective = None
    if name is not None:
        objective = objectives.get(name)
        if objective is None:
            shown = name[:60] if OBJECTIVE_NAME.fullmatch(name) else repr(name[:60])
            known = ", ".join(sorted(objectives)[:_HEADER_NAMES_MAX])
            raise _ApiError(
                400, f"unknown inference objective {shown}; "
                + (f"known: {known}" if known else "the gateway has none (serve --objectives)"),
                param=OBJECTIVE_HEADER, code="unknown_objective",
            )  # fmt: skip
    tenant = _header(request, FAIRNESS_HEADER)
    if tenant is not None and not _FAIRNESS_ID.fullmatch(tenant):
        raise _ApiError(
            400, f"header {FAIRNESS_HEADER} must be 1-256 visible ASCII characters, "
            f"got {tenant[:40]!r}", param=FAIRNESS_HEADER, code="invalid_value",
        )  # fmt: skip
    return objective, tenant


def _slo_inputs(
    body: AnyRequest, request: Request, preset: str, objective: Objective | None = None
) -> tuple[RequestClass, int, SLO, QoESpec | None]:
    header_cls = _header(request, "x-request-class")  # checked even when the body's wins
    raw_cls = header_cls if body.request_class is None else body.request_class
    if header_cls is not None and header_cls.lower() not in ("rt", "be"):
        raise _ApiError(
            400, f"x-request-class must be rt or be, got {header_cls[:40]!r}",
            param="x-request-class", code="invalid_value",
        )  # fmt: skip
    cls = RequestClass((raw_cls or "rt").lower())
    rule = SLO_PRESETS[preset][cls]
    ttft_ms = _header_ms(request, "x-slo-ttft-ms")
    tpot_ms = _header_ms(request, "x-slo-tpot-ms")
    # QLM's end-to-end deadline (arrival to last token); an objective has none
    deadline_ms = _header_ms(request, "x-slo-e2e-ms")
    if objective is not None:
        ttft_ms = ttft_ms if ttft_ms is not None else objective.ttft_ms
        tpot_ms = tpot_ms if tpot_ms is not None else objective.tpot_ms
    if body.slo is not None:
        ttft_ms = body.slo.ttft_ms if body.slo.ttft_ms is not None else ttft_ms
        tpot_ms = body.slo.tpot_ms if body.slo.tpot_ms is not None else tpot_ms
        deadline_ms = body.slo.deadline_ms if body.slo.deadline_ms is not None else deadline_ms
    slo = SLO(
        ttft_ms / 1000 if ttft_ms is not None else rule.ttft_s,
        tpot_ms / 1000 if tpot_ms is not None else rule.tpot_s,
        deadline_ms / 1000 if deadline_ms is not None else rule.deadline_s,
    )
    qoe = QoESpec(body.qoe.ttft_s, body.qoe.tokens_per_s) if body.qoe is not None else None
    # an objective's priority is the Inference Extension's (higher first), ours vLLM's
    fallback = rule.priority if objective is None else -objective.priority
    priority = body.priority if body.priority is not None else fallback
    return cls, priority, slo, qoe


def _max_tokens_param(body: AnyRequest) -> str:
    """The field that set the output cap (``max_completion_tokens`` wins on chat)."""
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        return "max_completion_tokens"
    return "max_tokens"
