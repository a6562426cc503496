"""What the OpenAI-compatible API answers, against a real server on 127.0.0.1 (the openai
SDK and httpx): completions and chat, streamed or not, the SSE framing and its
precomputed token events, usage (with vLLM's continuous_usage_stats), the max_tokens
defaults, and server-side pacing of a stream."""

# ruff: noqa: F811 - the fixtures imported from serve_helpers are test parameters

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from serve_helpers import (  # noqa: F401  (client, server: fixtures)
    _MSG,
    MODEL,
    LiveServer,
    client,
    expected_text,
    live_server,
    server,
    sse_events,
)
from sloserve.serve.api import GatewaySettings
from sloserve.serve.schemas import (
    CHAT_REPLY_PRIMING_TOKENS,
    CHAT_TOKENS_PER_MESSAGE,
    ChunkFactory,
    count_text_tokens,
    filler_text,
    sse,
)


def test_sdk_completion_non_streaming(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello there, world!", max_tokens=7)
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert out.model == MODEL
    (choice,) = out.choices
    assert choice.text == expected_text(7)
    assert choice.finish_reason == "length" and choice.index == 0 and choice.logprobs is None
    # "Hello there, world!" = Hello there , world ! (5) + BOS
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (6, 7)
    assert out.usage.total_tokens == 13


def test_sdk_completion_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL, prompt=[1, 2, 3, 4], max_tokens=5, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert len(chunks) == 6  # one per token, then the usage chunk
    ids = {c.id for c in chunks}
    assert len(ids) == 1
    texts = [c.choices[0].text for c in chunks[:5]]
    assert texts == [filler_text(i) for i in range(5)]
    assert [c.choices[0].finish_reason for c in chunks[:5]] == [None] * 4 + ["length"]
    assert all(c.usage is None for c in chunks[:5])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 5)


def test_sdk_chat_non_streaming(client: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi."},
    ]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    (choice,) = out.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_text(4)
    assert choice.finish_reason == "length"
    n_prompt = CHAT_REPLY_PRIMING_TOKENS + 2 * CHAT_TOKENS_PER_MESSAGE
    n_prompt += count_text_tokens("You are terse.") + count_text_tokens("Say hi.")
    assert out.usage is not None and out.usage.prompt_tokens == n_prompt == 16
    assert out.usage.completion_tokens == 4


def test_sdk_chat_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in chunks[1:]] == [filler_text(i) for i in range(3)]
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, "length"]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.usage is None for c in chunks)  # include_usage not asked


def test_raw_sse_format(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": True, "stream_options": {"include_usage": True},
        },
        timeout=10,
    )  # fmt: skip
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert [list(o) for o in objs] == [["id", "object", "created", "model", "choices", "usage"]] * 4
    assert objs[0]["choices"][0] == {
        "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
        "finish_reason": None,
    }  # fmt: skip
    assert objs[2]["choices"][0] == {
        "index": 0, "delta": {"content": filler_text(1)}, "logprobs": None,
        "finish_reason": "length",
    }  # fmt: skip
    assert objs[3]["choices"] == [] and objs[3]["usage"] == {
        "prompt_tokens": 3 + 3 + 1, "completion_tokens": 2, "total_tokens": 9,
    }  # fmt: skip


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_token_event_template_is_the_chunk(chat: bool, usage: bool) -> None:
    f = ChunkFactory("cmpl-1", 'mo"del\u00e9', chat, usage)
    for text in (" the", 'q"uote\\', "\u00e9\u4e2d\n"):
        assert f.token_event(text, None) == sse(f.token_chunk(text, None))
        assert json.loads(f.token_event(text, None)[6:]) == f.token_chunk(text, None)
    assert f.token_event(" x", "stop") == sse(f.token_chunk(" x", "stop"))


def test_max_completion_tokens_and_defaults(server: LiveServer) -> None:
    url = f"{server.base_url}/chat/completions"
    r = httpx.post(
        url,
        json={"model": MODEL, "messages": _MSG, "max_completion_tokens": 2, "max_tokens": 9},
        timeout=10,
    )
    assert r.json()["usage"]["completion_tokens"] == 2  # the newer field wins
    r = httpx.post(
        f"{server.base_url}/completions", json={"model": MODEL, "prompt": "hi"}, timeout=10
    )
    assert r.json()["usage"]["completion_tokens"] == 16  # OpenAI's completions default
    r = httpx.post(url, json={"model": MODEL, "messages": _MSG}, timeout=10)
    assert r.json()["usage"]["completion_tokens"] == 256  # --default-max-tokens
    long = [{"role": "user", "content": "w " * 3950}]  # 3,956 prompt tokens of 4,096
    r = httpx.post(url, json={"model": MODEL, "messages": long}, timeout=10)
    assert r.json()["usage"]["completion_tokens"] == 4096 - 3956  # what the context leaves


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats(server: LiveServer, chat: bool) -> None:
    """vLLM's continuous_usage_stats (guidellm sends it): running usage on every chunk."""
    path, prompt = (
        ("chat/completions", {"messages": [{"role": "user", "content": "hi there"}]})
        if chat
        else ("completions", {"prompt": "hi there"})
    )
    body: dict[str, Any] = {
        "model": MODEL, "max_tokens": 5, "stream": True, **prompt,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    r = httpx.post(f"{server.base_url}/{path}", json=body, timeout=10)
    assert r.status_code == 200
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    n_prompt = chunks[-1]["usage"]["prompt_tokens"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    counts = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
    assert counts == ([0] if chat else []) + [1, 2, 3, 4, 5]
    for c in chunks:
        u = c["usage"]
        assert u["prompt_tokens"] == n_prompt
        assert u["total_tokens"] == n_prompt + u["completion_tokens"]
    # without include_usage it does nothing (as vLLM), and it is accepted
    body["stream_options"] = {"continuous_usage_stats": True}
    r = httpx.post(f"{server.base_url}/{path}", json=body, timeout=10)
    assert r.status_code == 200
    events = sse_events(r)
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_continuous_usage_template_is_the_chunk() -> None:
    f = ChunkFactory("cmpl-1", "m", False, True, continuous_usage=True, prompt_tokens=7)
    ev = json.loads(f.token_event(' "q"', None, 3)[6:])
    assert ev == {**f.token_chunk(' "q"', None), "usage": {
        "prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}  # fmt: skip
    assert json.loads(f.token_event("", "stop", 4)[6:])["usage"]["completion_tokens"] == 4


def test_server_side_pacing() -> None:
    """--pacing releases a stream at its qoe.tokens_per_s, never faster."""
    with live_server(settings=GatewaySettings(pacing=True)) as srv:
        body = {
            "model": MODEL, "prompt": "hi", "max_tokens": 8, "stream": True,
            "qoe": {"ttft_s": 0.0, "tokens_per_s": 50.0},
        }  # fmt: skip
        times: list[float] = []
        with httpx.stream("POST", f"{srv.base_url}/completions", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
        assert len(times) == 8
        gaps = np.diff(times)
        # 20 ms apart (the engine alone: ~0.5 ms at 20x). Receipt times jitter on a busy
        # machine (a late token makes the next gap short), so check the typical gap and the
        # span rather than every single gap.
        assert np.median(gaps) > 0.015
        assert sum(gaps) == pytest.approx(7 * 0.02, abs=0.05)
        # without a qoe spec, nothing is paced
        times.clear()
        del body["qoe"]
        with httpx.stream("POST", f"{srv.base_url}/completions", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.monotonic())
        assert times[-1] - times[0] < 0.1
