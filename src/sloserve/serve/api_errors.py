"""The gateway's errors as OpenAI error bodies (FastAPI).

An error answered before any token is an :class:`_ApiError`, sent as
``{"error": {"message", "type", "param", "code"}}``; a backend's :class:`ServeError` becomes
one with ``Retry-After`` and ``x-sloserve-drop-reason`` (:func:`_serve_error`); a validation
error's location becomes OpenAI's ``param`` (:func:`_param_of`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

from sloserve.serve.backend import ServeError
from sloserve.serve.schemas import (
    error_body,
)

_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class _ApiError(Exception):
    """An error answered before any token: becomes an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def _error_response(e: _ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(e.message, _ERROR_TYPES.get(e.status, "api_error"), e.param, e.code),
        status_code=e.status,
        headers=e.headers,
    )


def _serve_error(e: ServeError) -> _ApiError:
    headers = {"x-sloserve-drop-reason": e.reason}
    if e.retry_after_s is not None:
        # whole seconds (RFC 9110), rounded up: never sooner than the backend asked
        headers["retry-after"] = str(max(1, math.ceil(e.retry_after_s)))
    return _ApiError(e.status, str(e), code=e.reason, headers=headers)


_UNION_TAG = re.compile(r"^(str|int|float|bool|none|[\w-]+\[.*\])$")
"""Location entries pydantic adds for union members (``prompt.list[int]``): not fields."""


def _param_of(loc: Sequence[Any]) -> str | None:
    """OpenAI's ``param`` for a validation error location: ``messages[0].role``."""
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p != "body" and not _UNION_TAG.match(str(p)):
            out += f".{p}" if out else str(p)
    return out or None
