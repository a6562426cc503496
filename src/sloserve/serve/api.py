"""The OpenAI-compatible HTTP API of the gateway (FastAPI): :func:`create_app`.

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming SSE with
OpenAI's exact chunk objects and ``data: [DONE]``, ``stream_options.include_usage``, and
non-streaming), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus) and the
OpenAPI schema at ``/openapi.json``.

SLO inputs, by precedence (a field set in a higher source wins, field by field):

1. the body: ``priority``, ``slo`` {``ttft_ms``, ``tpot_ms``, ``deadline_ms``},
   ``qoe`` {``ttft_s``, ``tokens_per_s``}, ``request_class`` (``rt`` | ``be``);
2. the headers ``x-slo-ttft-ms``, ``x-slo-tpot-ms``, ``x-request-class`` (the convention of
   inference-perf and the Kubernetes inference gateway) and ``x-slo-e2e-ms`` (QLM's
   end-to-end deadline, the header twin of ``slo.deadline_ms``);
3. the defaults of the request's class from an SLO preset (``--slo-preset``, the presets of
   :data:`sloserve.workloads.rules.SLO_PRESETS`; ``bros``, the default, gives ``rt`` a TTFT
   of 400 ms and a TPOT of 200 ms and ``be`` no target; both priority 0). A request
   without a class is ``rt``.

Errors are OpenAI error bodies ``{"error": {"message", "type", "param", "code"}}``: 400
for invalid or unsupported input (FastAPI's 422 is turned into OpenAI's 400), 404 for an
unknown model, 429 with ``Retry-After`` and 503 with the cause in
``x-sloserve-drop-reason``. A failure after the first token ends the stream with an SSE
``data: {"error": …}`` event and then ``data: [DONE]``. ``max_tokens`` defaults to 16 on
``/v1/completions`` (OpenAI's default) and to ``default_max_tokens`` on chat, in both
cases capped by the room the context leaves after the prompt.

Graceful shutdown (:class:`~sloserve.serve.server.GatewayServer`, what ``sloserve serve``
runs): the server stops accepting, the backend refuses new requests (503 ``shutdown``) and
lets open streams finish for ``drain_timeout_s``, then ends the rest with an SSE error event
and ``[DONE]``.

This module holds the settings and the app with its routes and request handling; errors are
in :mod:`~sloserve.serve.api_errors`, the SLO inputs in :mod:`~sloserve.serve.api_inputs`,
the SSE response and disconnect watching in :mod:`~sloserve.serve.api_stream`, the uvicorn
server in :mod:`~sloserve.serve.server`.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from sloserve.core.errors import SloserveError
from sloserve.serve.api_errors import _ApiError, _error_response, _param_of, _serve_error
from sloserve.serve.api_inputs import (
    _HEADER_NAMES_MAX,
    _class_label,
    _gateway_inputs,
    _header_list,
    _max_tokens_param,
    _slo_inputs,
)
from sloserve.serve.api_stream import (
    _DONE,
    _backend_next,
    _chain,
    _close,
    _Disconnected,
    _finish,
    _GatewayApp,
    _SSEResponse,
    _unless_disconnected,
    _Write,
)
from sloserve.serve.backend import Backend, GenerationRequest, ServeError, TokenChunk
from sloserve.serve.metrics import GatewayMetrics, RequestRecord, status_of_http
from sloserve.serve.objectives import Objective, check_objective_names
from sloserve.serve.schemas import (
    AnyRequest,
    ChatCompletionRequest,
    ChunkFactory,
    CompletionRequest,
    error_body,
    prompt_tokens,
    requested_max_tokens,
    sse,
    unsupported_params,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` of the legacy completions endpoint."""

_CLIENT_ERROR_OF_STATUS = {408: "read_timeout", 413: "body_too_large"}


def _is_json(content_type: str) -> bool:
    """``application/json`` or ``application/*+json`` (parameters aside)."""
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (
        main.startswith("application/") and main.endswith("+json")
    )


class GatewaySettings(BaseModel):
    """Options of the HTTP layer (the backend has its own config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strict: bool = Field(
        default=False,
        description="reject unknown body fields (400); lenient mode names them in the "
        "x-sloserve-forwarded-params header (a backend that passes them on) or in "
        "x-sloserve-ignored-params (one that drops them)",
    )
    slo_preset: Literal["bros", "qlm", "none"] = Field(
        default="bros", description="per-class SLO defaults"
    )
    default_max_tokens: int = Field(
        default=256, ge=1, description="chat max_tokens when the request sets none"
    )
    pacing: bool = Field(
        default=False, description="pace each stream server-side at its qoe.tokens_per_s"
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, le=86_400, allow_inf_nan=False,
        description="graceful shutdown: wait this long for open streams (at most a day)",
    )  # fmt: skip
    request_read_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, allow_inf_nan=False,
        description="a request's headers, and then its body, must arrive within this many "
        "seconds (else 408)",
    )  # fmt: skip
    max_body_bytes: int = Field(
        default=32 * 2**20, ge=1024, le=2**30,
        description="largest request body (else 413); 32 MiB holds a 128k-token prompt",
    )  # fmt: skip
    objectives: dict[str, Objective] = Field(
        default_factory=dict,
        description="named objectives a request selects with x-gateway-inference-objective "
        "(name -> {priority, ttft_ms, tpot_ms}; priority: higher is more important, below "
        "zero sheddable); an unknown name is a 400",
    )
    workers: int = Field(
        default=1, ge=1, le=256,
        description="gateway processes sharing the port (sloserve serve --workers); above 1 "
        "the responses name their process in x-sloserve-worker-pid",
    )  # fmt: skip

    @field_validator("objectives")
    @classmethod
    def _objective_names(cls, v: dict[str, Objective]) -> dict[str, Objective]:
        try:
            return check_objective_names(v)
        except SloserveError as e:
            raise ValueError(str(e)) from None


def create_app(backend: Backend, settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway's ASGI app in front of ``backend`` (started and stopped by its lifespan)."""
    cfg = settings or GatewaySettings()
    metrics = GatewayMetrics(backend)
    stopping: list[asyncio.Task[None]] = []

    async def drain() -> None:
        """Stop the backend once: refuse new requests, let open streams finish for
        ``drain_timeout_s``, then end the rest with an error event."""
        if not stopping:
            stopping.append(asyncio.ensure_future(backend.stop(cfg.drain_timeout_s)))
        await stopping[0]

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await drain()

    app = _GatewayApp(
        title="sloserve gateway",
        description="OpenAI-compatible streaming gateway running sloserve's scheduling policies.",
        version="0.1",
        lifespan=lifespan,
    )
    app.state.backend = backend
    app.state.metrics = metrics
    app.state.settings = cfg
    app.state.drain = drain

    @app.exception_handler(RequestValidationError)
    async def _invalid(req: Request, exc: RequestValidationError) -> JSONResponse:
        if req.url.path.startswith("/v1/"):
            metrics.count("rejected", _class_label(req))  # no valid body: the header's
        errs = exc.errors()
        first = errs[0] if errs else {}
        param = _param_of(first.get("loc", ()))
        ctype = req.headers.get("content-type", "")
        if tuple(first.get("loc", ())) == ("body",) and not _is_json(ctype):
            # FastAPI reads only a JSON content type: a body sent as anything else
            metrics.client_error("unsupported_media_type")
            e = _ApiError(
                415, f"the body must be JSON with content-type application/json, got "
                f"{ctype[:60]!r}", code="unsupported_media_type",
            )  # fmt: skip
            return _error_response(e)
        if first.get("type") == "json_invalid":
            metrics.client_error("malformed_json")
            msg = f"malformed JSON body: {first.get('msg', '')}"
            param = None
        elif first.get("type") == "missing" and param:
            msg = f"missing required field {param!r}"
        else:
            msg = f"{param or 'body'}: {first.get('msg', 'invalid')}"
            if len(errs) > 1:
                msg += f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})"
        return _error_response(_ApiError(400, msg, param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = _CLIENT_ERROR_OF_STATUS.get(exc.status_code)
        headers: dict[str, str] = {}
        if reason is not None:
            metrics.client_error(reason)
            if req.url.path.startswith("/v1/"):
                metrics.count("rejected", _class_label(req))
            headers["connection"] = "close"  # the rest of the body is not worth reading
        return _error_response(
            _ApiError(exc.status_code, str(exc.detail), code=reason, headers=headers)
        )

    @app.exception_handler(_ApiError)
    async def _api(_req: Request, exc: _ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(Exception)
    async def _crash(_req: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            error_body(f"internal error: {type(exc).__name__}: {exc}", "api_error"),
            status_code=500,
        )

    # ------------------------------------------------------------------ plain endpoints
    @app.get("/health")
    async def health() -> JSONResponse:
        if backend.healthy:
            return JSONResponse({"status": "ok"})
        e = _ApiError(
            503, "no backend is healthy", code="no_backend",
            headers={"x-sloserve-drop-reason": "no_backend"},
        )  # fmt: skip
        return _error_response(e)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": created, "owned_by": "sloserve"}
                for m in backend.models()
            ],
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ generation
    def _prepare(
        body: AnyRequest, request: Request, chat: bool
    ) -> tuple[GenerationRequest, dict[str, str]]:
        extra = sorted((body.model_extra or {}).keys())
        headers: dict[str, str] = {}
        if cfg.workers > 1:
            headers["x-sloserve-worker-pid"] = str(os.getpid())
        if extra:
            if cfg.strict:
                more = len(extra) - _HEADER_NAMES_MAX
                names = ", ".join(extra[:_HEADER_NAMES_MAX]) + (
                    f" (+{more} more)" if more > 0 else ""
                )
                raise _ApiError(
                    400, f"unknown parameter{'s' if len(extra) > 1 else ''}: {names}",
                    param=extra[0], code="unknown_parameter",
                )  # fmt: skip
            forwarded = backend.forwards_unknown_params
            what = "forwarded" if forwarded else "ignored"
            headers[f"x-sloserve-{what}-params"] = _header_list(extra)
        dumped = body.model_dump(exclude_unset=True)
        if extra and not backend.forwards_unknown_params:
            for k in extra:  # the header says "ignored": make it so
                dumped.pop(k, None)
        bad = unsupported_params(body) + backend.check_params(dumped)
        if bad:
            raise _ApiError(
                400, f"unsupported parameter{'s' if len(bad) > 1 else ''}: {', '.join(bad)}",
                param=bad[0].split(" ")[0], code="unsupported_parameter",
            )  # fmt: skip
        served = backend.models()
        if served and body.model not in served:
            raise _ApiError(
                404,
                f"model {body.model!r} does not exist; served: {', '.join(served)}",
                param="model", code="model_not_found",
            )  # fmt: skip
        objective, fairness_id = _gateway_inputs(request, cfg.objectives)
        cls, priority, slo, qoe = _slo_inputs(body, request, cfg.slo_preset, objective)
        n_prompt = prompt_tokens(body)
        ctx = backend.max_context()
        asked = requested_max_tokens(body)
        if ctx is not None:
            room = ctx - n_prompt
            if room < 1 or (asked is not None and asked > room):
                raise _ApiError(
                    400,
                    f"this model's maximum context length is {ctx} tokens; the request has "
                    f"{n_prompt} prompt tokens and asks for {asked or 'at least 1'} more",
                    param=(_max_tokens_param(body) if room >= 1
                           else ("messages" if chat else "prompt")),
                    code="context_length_exceeded",
                )  # fmt: skip
        least = body.min_tokens or 0
        if asked is not None and least > asked:
            raise _ApiError(
                400, f"min_tokens ({least}) must not exceed {_max_tokens_param(body)} ({asked})",
                param="min_tokens", code="invalid_value",
            )  # fmt: skip
        if ctx is not None and least > ctx - n_prompt:
            raise _ApiError(
                400,
                f"this model's maximum context length is {ctx} tokens; the request has "
                f"{n_prompt} prompt tokens and asks for at least {least} more (min_tokens)",
                param="min_tokens", code="context_length_exceeded",
            )  # fmt: skip
        if asked is None:
            # the default cap never undercuts the client's own floor
            asked = max(least, COMPLETIONS_DEFAULT_MAX_TOKENS if not chat
                        else cfg.default_max_tokens)  # fmt: skip
            if ctx is not None:
                asked = min(asked, ctx - n_prompt)
        greq = GenerationRequest(
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            endpoint="chat.completions" if chat else "completions",
            model=body.model,
            prompt_tokens=n_prompt,
            max_tokens=asked,
            arrival=time.monotonic(),
            priority=priority,
            sheddable=objective is not None and objective.sheddable,
            fairness_id=fairness_id,
            slo=slo,
            qoe=qoe,
            request_class=cls,
            body=dumped,
        )
        return greq, headers

    async def _generate(body: AnyRequest, request: Request, chat: bool) -> Response:
        arrival = time.monotonic()
        try:
            greq, headers = _prepare(body, request, chat)
        except _ApiError as e:
            metrics.count(status_of_http(e.status), _class_label(request, body), model=body.model)
            raise
        cls = greq.request_class.value
        count = partial(metrics.count, request_class=cls, request_id=greq.request_id,
                        model=greq.model)  # fmt: skip
        agen = backend.generate(greq)
        try:
            first = await _unless_disconnected(request, agen.__anext__())
        except _Disconnected:
            # Gone while queued: the backend's generator was cancelled and freed its slot.
            count("cancelled")
            return Response(status_code=499)
        except ServeError as e:
            count(status_of_http(e.status))
            raise _serve_error(e) from None
        except StopAsyncIteration:
            count("error")
            raise _ApiError(500, "the backend ended the request without a token") from None
        except BaseException as e:
            # a bug in the backend (a 500) or this handler cancelled: still counted, once
            count("error" if isinstance(e, Exception) else "cancelled")
            await _close(agen)
            raise
        rec = RequestRecord(cls, arrival, greq.slo, greq.qoe, request_id=greq.request_id,
                            model=greq.model, prompt_tokens=greq.prompt_tokens)  # fmt: skip
        opts = body.stream_options
        factory = ChunkFactory(
            greq.request_id,
            body.model,
            chat,
            bool(opts is not None and opts.include_usage),
            continuous_usage=bool(opts is not None and opts.continuous_usage_stats),
            prompt_tokens=greq.prompt_tokens,
        )
        head: TokenChunk | None = first
        source: AsyncIterator[TokenChunk] = agen
        drain: Callable[[], list[TokenChunk]] | None = getattr(agen, "drain_nowait", None)
        if cfg.pacing and greq.qoe is not None:
            from sloserve.serve.pacer import TokenPacer

            # the pacer releases tokens one by one, the first included
            source = TokenPacer(
                _chain(first, agen), greq.qoe.tokens_per_s, weight=lambda c: c.num_tokens
            )
            head, drain = None, None
        if body.stream:
            run = partial(_write_sse, head, source, agen, drain, factory, rec, greq.prompt_tokens)
            return _SSEResponse(partial(run, chat), {**headers, "cache-control": "no-cache"})
        stream = source if head is None else _chain(head, source)
        try:
            return await _unless_disconnected(
                request, _full(stream, agen, factory, rec, greq.prompt_tokens, headers)
            )
        except _Disconnected:
            return Response(status_code=499)

    async def _write_sse(
        first: TokenChunk | None,
        source: AsyncIterator[TokenChunk],
        agen: AsyncIterator[TokenChunk],
        drain: Callable[[], list[TokenChunk]] | None,
        factory: ChunkFactory,
        rec: RequestRecord,
        n_prompt: int,
        chat: bool,
        write: _Write,
    ) -> None:
        """Write one SSE stream: per wake-up, every chunk the backend has ready (``first``,
        then what ``drain`` hands over) goes out in one write, one SSE event per token;
        the last tokens, the usage chunk and ``[DONE]`` share a write."""
        status = "cancelled"
        completion = 0
        nxt = partial(_backend_next, source.__anext__)
        events: list[str] = [factory.role_event()] if chat else []
        try:
            try:
                chunk = first if first is not None else await nxt()
                while True:
                    batch = [chunk, *drain()] if drain and chunk.finish_reason is None else [chunk]
                    n = 0
                    try:
                        for c in batch:
                            n += c.num_tokens
                            if c.text or c.finish_reason is not None:
                                events.append(
                                    factory.token_event(c.text, _finish(c), completion + n)
                                )
                    finally:
                        completion += n
                        rec.tokens(time.monotonic(), n)
                    last = batch[-1]
                    if last.finish_reason is not None:
                        if last.prompt_tokens is not None:
                            n_prompt = rec.prompt_tokens = last.prompt_tokens
                        break
                    await write("".join(events).encode())
                    events.clear()
                    try:
                        chunk = await nxt()
                    except StopAsyncIteration:
                        raise ServeError(
                            "the backend ended the stream without a finish reason"
                        ) from None
            except ServeError as e:
                status = "error"
                events.append(sse(error_body(str(e), "api_error", None, e.reason)))
                events.append(_DONE)
                await write("".join(events).encode())
                return
            if factory.include_usage:
                events.append(sse(factory.usage_chunk(n_prompt, completion)))
            events.append(_DONE)
            await write("".join(events).encode())
            status = "ok"
        finally:
            await _close(source, agen)
            metrics.finish(rec, status)

    async def _full(
        stream: AsyncIterator[TokenChunk],
        agen: AsyncIterator[TokenChunk],
        factory: ChunkFactory,
        rec: RequestRecord,
        n_prompt: int,
        headers: dict[str, str],
    ) -> Response:
        parts: list[str] = []
        completion = 0
        finish: str | None = None
        status = "cancelled"
        try:
            async for chunk in stream:
                rec.tokens(time.monotonic(), chunk.num_tokens)
                completion += chunk.num_tokens
                parts.append(chunk.text)
                if chunk.finish_reason is not None:
                    finish = _finish(chunk)
                    if chunk.prompt_tokens is not None:
                        n_prompt = rec.prompt_tokens = chunk.prompt_tokens
                    break
            if finish is None:
                raise ServeError("the backend ended the request without a finish reason")
            status = "ok"
        except ServeError as e:
            status = "error"
            raise _serve_error(e) from None
        except Exception:
            status = "error"  # a bug in the backend: a 500, not a cancelled request
            raise
        finally:
            await _close(stream, agen)
            metrics.finish(rec, status)
        return JSONResponse(factory.full("".join(parts), finish, n_prompt, completion),
                            headers=headers)  # fmt: skip

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """OpenAI's text completions (streaming with ``"stream": true``)."""
        return await _generate(body, request, chat=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI's chat completions (streaming with ``"stream": true``)."""
        return await _generate(body, request, chat=True)

    return app
