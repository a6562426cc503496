"""Strict request typing and refused contradictions (issue 19, items 5 and 6).

The type and bound tests walk the request models field by field (every int, float and
bool field of every request schema, nested ones included), so a field added later is
covered without a new test, and an integer field without bounds fails here.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

import httpx
import pytest
from pydantic import BaseModel

from serve_helpers import MODEL, LiveServer, live_server
from sloserve.serve.schemas import (
    INT64_MAX,
    MS_MAX,
    TOKEN_MAX,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    QoEBody,
    SloBody,
    StreamOptions,
    request_bounds,
)

COMPLETION = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server() as srv:
        yield srv


def _kind(annotation: Any) -> str | None:
    """``int``, ``float`` or ``bool`` for a scalar field (optional or not), else None."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
    members = {a for a in args if a is not type(None)} if args else {annotation}
    if len(members) == 1:
        (m,) = members
        if m in (int, float, bool):
            return str(m.__name__)
    return None


def _fields() -> list[tuple[str, str, str, Any]]:
    """(endpoint, JSON path, kind, field info) of every scalar number/bool field."""
    nested: dict[str, tuple[type[BaseModel], Any]] = {
        "stream_options": (StreamOptions, {"stream": True}),
        "slo": (SloBody, {}),
        "qoe": (QoEBody, {}),
    }
    out: list[tuple[str, str, str, Any]] = []
    for endpoint, model in (("completions", CompletionRequest), ("chat", ChatCompletionRequest)):
        for name, f in model.model_fields.items():
            kind = _kind(f.annotation)
            if kind is not None:
                out.append((endpoint, name, kind, f))
            elif name in nested:
                for sub, sf in nested[name][0].model_fields.items():
                    sk = _kind(sf.annotation)
                    assert sk is not None, f"{name}.{sub}: a new kind of field, cover it here"
                    out.append((endpoint, f"{name}.{sub}", sk, sf))
    for name, f in ChatMessage.model_fields.items():
        kind = _kind(f.annotation)
        if kind is not None:
            out.append(("chat", f"messages[0].{name}", kind, f))
    return out


FIELDS = _fields()


def _bounds(f: Any) -> tuple[Any, Any, bool, bool]:
    """(low, high, low exclusive, high exclusive) of a field's constraints."""
    low = high = None
    low_x = high_x = False
    for m in f.metadata:
        if getattr(m, "ge", None) is not None:
            low = m.ge
        if getattr(m, "gt", None) is not None:
            low, low_x = m.gt, True
        if getattr(m, "le", None) is not None:
            high = m.le
        if getattr(m, "lt", None) is not None:
            high, high_x = m.lt, True
    return low, high, low_x, high_x


def _body(endpoint: str, path: str, value: Any) -> dict[str, Any]:
    body: dict[str, Any] = {**(COMPLETION if endpoint == "completions" else CHAT)}
    body["messages"] = [dict(m) for m in body.get("messages", [])] or None
    if body["messages"] is None:
        del body["messages"]
    if path.startswith("messages[0]."):
        body["messages"][0][path.split(".", 1)[1]] = value
        return body
    if "." in path:
        outer, inner = path.split(".")
        base = {"stream": True} if outer == "stream_options" else {}
        body.update(base)
        full = {"ttft_s": 1.0, "tokens_per_s": 10.0} if outer == "qoe" else {}
        body[outer] = {**full, inner: value}
        return body
    body[path] = value
    return body


def _wrong_values(kind: str) -> list[Any]:
    if kind == "int":
        return ["10", True, 10.5, 3.0, [1], {"a": 1}]
    if kind == "float":
        return ["0.5", True, [0.5], {"v": 1}]
    return ["yes", "true", 1, 0, [True]]


CASES = [
    pytest.param(endpoint, path, value, id=f"{endpoint}-{path}-{value!r}")
    for endpoint, path, kind, _f in FIELDS
    for value in _wrong_values(kind)
]


def _assert_400(resp: httpx.Response, param: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err


@pytest.mark.parametrize(("endpoint", "path", "value"), CASES)
def test_wrong_json_types_are_refused(
    server: LiveServer, endpoint: str, path: str, value: Any
) -> None:
    url = f"{server.base_url}/{'completions' if endpoint == 'completions' else 'chat/completions'}"
    _assert_400(httpx.post(url, json=_body(endpoint, path, value), timeout=10), path)


def test_the_issue_examples_are_refused(server: LiveServer) -> None:
    url = f"{server.base_url}/completions"
    for field, value in (("max_tokens", "10"), ("max_tokens", True), ("stream", "yes")):
        _assert_400(httpx.post(url, json={**COMPLETION, field: value}, timeout=10), field)
    body = {**COMPLETION, "stream": True, "stream_options": {"include_usage": "yes"}}
    _assert_400(httpx.post(url, json=body, timeout=10), "stream_options.include_usage")


def test_every_integer_field_is_bounded_on_both_sides() -> None:
    ints = [(e, p, f) for e, p, k, f in FIELDS if k == "int"]
    assert {p for _e, p, _f in ints} >= {"max_tokens", "seed", "priority", "n", "min_tokens"}
    for _e, path, f in ints:
        low, high, _lx, _hx = _bounds(f)
        assert low is not None and high is not None, f"{path} has no bound"
        assert low >= -(2**63) and high <= INT64_MAX, path
    for _e, path, _k, f in FIELDS:
        if "tokens" in path and _bounds(f)[1] is not None:
            assert _bounds(f)[1] <= TOKEN_MAX, path
    assert request_bounds()["CompletionRequest"]["seed"] == (-(2**63), INT64_MAX)


def _outside(kind: str, f: Any) -> list[Any]:
    """The nearest values just outside a field's bounds."""
    low, high, low_x, high_x = _bounds(f)
    step = 1 if kind == "int" else 1e-3
    out = []
    if low is not None:
        out.append(low if low_x else low - step)
    if high is not None:
        out.append(high if high_x else high + (step if kind == "int" else max(step, high * 1e-6)))
    return out


BOUND_CASES = [
    pytest.param(endpoint, path, value, id=f"{endpoint}-{path}-{value!r}")
    for endpoint, path, kind, f in FIELDS
    if kind in ("int", "float")
    for value in _outside(kind, f)
]


@pytest.mark.parametrize(("endpoint", "path", "value"), BOUND_CASES)
def test_values_outside_the_bounds_are_refused(
    server: LiveServer, endpoint: str, path: str, value: Any
) -> None:
    url = f"{server.base_url}/{'completions' if endpoint == 'completions' else 'chat/completions'}"
    _assert_400(httpx.post(url, json=_body(endpoint, path, value), timeout=10), path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 1), ("top_p", 1), ("presence_penalty", 0), ("min_p", 0)],
)
def test_a_float_field_takes_an_integer(server: LiveServer, field: str, value: int) -> None:
    r = httpx.post(f"{server.base_url}/completions", json={**COMPLETION, field: value}, timeout=10)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("ids", [[-1], [TOKEN_MAX + 1], [1.5], ["7", 8], [[1, "2"]], [[2**40]]])
def test_token_id_prompts_are_typed_and_bounded(server: LiveServer, ids: list[Any]) -> None:
    r = httpx.post(f"{server.base_url}/completions", json={**COMPLETION, "prompt": ids}, timeout=10)
    _assert_400(r, "prompt")


# ----------------------------------------------------------------------------- contradictions
@pytest.mark.parametrize(
    ("endpoint", "extra"),
    [
        ("completions", {"max_tokens": 5, "min_tokens": 6}),
        ("chat", {"max_tokens": 5, "min_tokens": 6}),
        ("chat", {"max_tokens": 50, "max_completion_tokens": 5, "min_tokens": 6}),
    ],
)
def test_min_tokens_above_max_tokens(
    server: LiveServer, endpoint: str, extra: dict[str, int]
) -> None:
    base = COMPLETION if endpoint == "completions" else CHAT
    path = "completions" if endpoint == "completions" else "chat/completions"
    r = httpx.post(f"{server.base_url}/{path}", json={**base, **extra}, timeout=10)
    _assert_400(r, "min_tokens")


@pytest.mark.parametrize("max_tokens", [None, 100])
def test_min_tokens_the_context_cannot_hold(server: LiveServer, max_tokens: int | None) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "x", "min_tokens": 5000}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    r = httpx.post(f"{server.base_url}/completions", json=body, timeout=10)
    _assert_400(r, "min_tokens")


def test_min_tokens_raises_the_default_cap(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": "x", "min_tokens": 20}  # the default cap is 16
    r = httpx.post(f"{server.base_url}/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 20


@pytest.mark.parametrize("role", ["system", "developer", "user", "tool"])
@pytest.mark.parametrize("content", ["null", "missing"])
def test_chat_message_content_required(server: LiveServer, role: str, content: str) -> None:
    msg: dict[str, Any] = {"role": role}
    if role == "tool":
        msg["tool_call_id"] = "call_1"
    if content == "null":
        msg["content"] = None
    body = {**CHAT, "messages": [{"role": "user", "content": "hi"}, msg]}
    r = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=10)
    _assert_400(r, "messages[1].content")


def test_assistant_content_null_only_with_tool_calls(server: LiveServer) -> None:
    url = f"{server.base_url}/chat/completions"
    bare = {**CHAT, "messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": None}]}  # fmt: skip
    _assert_400(httpx.post(url, json=bare, timeout=10), "messages[1].content")
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ok = {**CHAT, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]}  # fmt: skip
    r = httpx.post(url, json=ok, timeout=10)
    assert r.status_code == 200, r.text


# ----------------------------------------------------------------------------- headers
@pytest.mark.parametrize("name", ["x-slo-ttft-ms", "x-slo-tpot-ms"])
@pytest.mark.parametrize(
    "value",
    ["abc", "", "nan", "inf", "-5", "0", "1_000", "0x10", "+5", f"{MS_MAX * 10:.0f}", "1e9",
     "100, 200"],
)  # fmt: skip
def test_invalid_slo_headers(server: LiveServer, name: str, value: str) -> None:
    r = httpx.post(
        f"{server.base_url}/completions", json=COMPLETION, headers={name: value}, timeout=10
    )
    _assert_400(r, name)


@pytest.mark.parametrize(
    ("name", "values", "ok"),
    [
        ("x-slo-ttft-ms", ["100", "200"], False),
        ("x-slo-ttft-ms", ["100", "abc"], False),
        ("x-slo-ttft-ms", ["100", "100"], True),
        ("x-slo-tpot-ms", ["50", "50.5"], False),
        ("x-request-class", ["rt", "be"], False),
        ("x-request-class", ["be", "nosuch"], False),
        ("x-request-class", ["be", "be"], True),
    ],
)
def test_repeated_headers_must_agree(
    server: LiveServer, name: str, values: list[str], ok: bool
) -> None:
    headers = [(name, v) for v in values]
    r = httpx.post(f"{server.base_url}/completions", json=COMPLETION, headers=headers, timeout=10)
    if ok:
        assert r.status_code == 200, r.text
    else:
        _assert_400(r, name)


def test_an_invalid_class_header_is_refused_even_when_the_body_sets_one(
    server: LiveServer,
) -> None:
    r = httpx.post(
        f"{server.base_url}/completions", json={**COMPLETION, "request_class": "be"},
        headers={"x-request-class": "nosuch"}, timeout=10,
    )  # fmt: skip
    _assert_400(r, "x-request-class")


def test_strict_server_still_serves_valid_requests() -> None:
    body = {**COMPLETION, "seed": -(2**63), "priority": INT64_MAX, "n": 1, "top_k": -1,
            "temperature": 0, "stream": False, "slo": {"ttft_ms": 500, "tpot_ms": 50.5}}  # fmt: skip
    with live_server() as srv:
        r = httpx.post(f"{srv.base_url}/completions", json=body, timeout=10)
        assert r.status_code == 200, r.text
