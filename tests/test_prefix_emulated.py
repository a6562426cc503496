"""The emulated gateway backend hands its engines a prompt identity (text hashed in
512-token blocks), so their prefix caches see the sharing of real prompts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from serve_helpers import emulated
from sloserve.serve.backend import GenerationRequest
from sloserve.serve.emulated_prefix import BLOCK_TOKENS, prompt_block_ids
from sloserve.serve.schemas import CompletionRequest, prompt_tokens

SHARED = " ".join(f"word{i}" for i in range(1200))  # 1,200 tokens: two full blocks


def greq(text: str, rid: str) -> GenerationRequest:
    body: dict[str, Any] = {"model": "llama-2-7b", "prompt": text, "max_tokens": 4}
    return GenerationRequest(
        request_id=rid, endpoint="completions", model="llama-2-7b",
        prompt_tokens=prompt_tokens(CompletionRequest(**body)), max_tokens=4,
        arrival=time.monotonic(), body=body,
    )  # fmt: skip


def test_block_ids_follow_the_gateways_token_count() -> None:
    a = prompt_block_ids({"prompt": SHARED + " and then one tail"})
    b = prompt_block_ids({"prompt": SHARED + ", another, longer tail " + "x " * 400})
    assert a is not None and b is not None
    assert len(a) == 1200 // BLOCK_TOKENS == 2  # a partial block has no id
    assert b[:2] == a and len(b) == 3
    assert prompt_block_ids({"prompt": "short"}) is None
    assert prompt_block_ids({}) is None
    other = prompt_block_ids({"prompt": "different " + SHARED})
    assert other is not None and other[0] != a[0]
    chat = {"messages": [{"role": "system", "content": SHARED}, {"role": "user", "content": "hi"}]}
    assert prompt_block_ids(chat) == a  # the system prompt's blocks, whatever follows
    ids = {"prompt": list(range(1100))}
    assert prompt_block_ids(ids) == prompt_block_ids({"prompt": [list(range(1030))]})


def test_a_shared_long_prefix_is_reused_by_the_emulated_engine() -> None:
    async def main() -> None:
        be = emulated(time_scale=50.0)
        await be.start()
        try:
            for rid, tail in (("cmpl-1", " first question ?"), ("cmpl-2", " second one !")):
                async for _chunk in be.generate(greq(SHARED + tail, rid)):
                    pass
            (inst,) = be.instances()
            first, second = sorted(inst.done, key=lambda r: r.req_id)
            assert first.hash_ids is not None and first.hash_ids == second.hash_ids
            assert first.num_cached_tokens == 0
            assert second.num_cached_tokens == 2 * BLOCK_TOKENS
        finally:
            await be.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
