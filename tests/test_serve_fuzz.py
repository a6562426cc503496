"""A bounded schemathesis run against the gateway's OpenAPI schema, on a real server.

Valid bodies (positive mode) get a 200 or a 4xx OpenAI error (a semantic refusal: a prompt
over the context, an unsupported parameter); invalid ones (negative mode) get a 4xx OpenAI
error; nothing gets a 5xx, and the server serves a plain request afterwards.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode

from serve_helpers import MODEL, live_server
from sloserve.experiments.runner import InstanceConfig

# Fast engine (1000x real time) and short outputs: a fuzzed request asking for thousands of
# tokens still ends in a few milliseconds.
_FAST = InstanceConfig(profile="llama-2-7b@a100-80gb", cost_model="constant:0.001")
_EXAMPLES = 20


def _check_error(body: Any) -> None:
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def _served_model(case: Any) -> Any:
    """Valid bodies name the served model (a random name is just one more 404)."""
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
    return case


def _fuzz(op: Any, mode: GenerationMode, url: str, seen: dict[str, set[int]]) -> Any:
    """A hypothesis test of one operation in one generation mode."""
    name = f"{op.method.upper()} {op.path} {mode.value}"
    post = op.method.upper() == "POST"

    strategy = op.as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE and post:
        strategy = strategy.map(_served_model)

    @given(case=strategy)
    @settings(
        max_examples=_EXAMPLES, deadline=None, database=None, derandomize=True,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    def check(case: Any) -> None:
        resp = case.call(base_url=url, timeout=30)
        code = resp.status_code
        seen.setdefault(name, set()).add(code)
        assert code < 500, (case.body, resp.text[:500])
        if code >= 400:
            _check_error(json.loads(resp.text))
        elif mode is GenerationMode.NEGATIVE and post:
            raise AssertionError(f"invalid body accepted: {case.body!r}")

    return check


def test_fuzz_openapi_schema() -> None:
    with live_server(instance=_FAST, time_scale=100.0) as srv:
        schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json")
        ops = []
        for res in schema.get_all_operations():
            assert isinstance(res, Ok), res
            ops.append(res.ok())
        paths = {(op.method.upper(), op.path) for op in ops}
        assert ("POST", "/v1/chat/completions") in paths and ("POST", "/v1/completions") in paths
        seen: dict[str, set[int]] = {}
        for op in ops:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and op.method.upper() == "GET":
                    continue  # no parameters to break
                _fuzz(op, mode, srv.url, seen)()
        # the positive runs did produce real completions, not only refusals
        ok = seen["POST /v1/completions positive"] | seen["POST /v1/chat/completions positive"]
        assert 200 in ok
        r = httpx.post(
            f"{srv.base_url}/completions",
            json={"model": MODEL, "prompt": "still here", "max_tokens": 2},
            timeout=10,
        )
        assert r.status_code == 200
