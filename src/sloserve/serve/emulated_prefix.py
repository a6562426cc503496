"""Prompt identity for the emulated backend's engines: the prompt hashed into blocks.

A simulated engine's prefix cache (``engine/prefix_cache.py``) matches prompts by their
identity blocks (:attr:`Request.hash_ids`, one id per 512-token block, as Mooncake's
traces give them). The gateway has only text, so it cuts the prompt into blocks of
:data:`BLOCK_TOKENS` tokens *as the gateway counts tokens* (words and punctuation marks,
:data:`~sloserve.serve.schemas.TOKEN_PATTERN`: what the emulated engine prefills) and
hashes each full block's text (blake2b, stable across processes); a token-id prompt's ids
are cut the same way. Equal leading blocks then mean an equal prefix, and the engine's
chained keys make a block count only behind an equal prefix.

Approximate, and documented as such (``docs/prefix-caching.md``): the engine's token
positions include the BOS token (and, for chats, the per-message tokens of OpenAI's
estimate) that the text blocks do not, so a block's boundaries sit a few tokens off the
engine's; two prompts sharing a prefix share its identity all the same. This is the
gateway-side counterpart of the prefix routers' approximate index
(:func:`sloserve.cluster.prefix_routing.text_block_ids`, 256-character chunks for routing
only): the engine's blocks must each stand for 512 tokens, so they are cut by tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sloserve.serve.replica_view import prompt_text
from sloserve.serve.schemas import TOKEN_PATTERN

BLOCK_TOKENS = 512
"""Tokens per identity block (the engines' ``hash_ids`` grain)."""


def _digest(parts: Sequence[str]) -> int:
    data = "\x1f".join(parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


def prompt_block_ids(
    body: dict[str, Any], block_tokens: int = BLOCK_TOKENS
) -> tuple[int, ...] | None:
    """One id per full ``block_tokens``-token block of the OpenAI body's prompt (None: no
    full block, or no prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of one token-id prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        tokens = [str(t) for t in prompt]
    else:
        tokens = TOKEN_PATTERN.findall(prompt_text(body))
    ids = tuple(
        _digest(tokens[i : i + block_tokens])
        for i in range(0, len(tokens) - block_tokens + 1, block_tokens)
    )
    return ids or None
