"""Prompt identity -> cache unit keys (the block-size mapping of
:mod:`~sloserve.engine.prefix_cache`'s docstring).

A prompt's identity is Mooncake's ``hash_ids``: one id per ``source_tokens`` (512) tokens,
equal ids meaning an identical block. A cache unit ``i`` (``unit_tokens`` tokens) is keyed
by the chained hash of every trace block up to the one holding its last token, with the
unit's end; when a unit is exactly one trace block, by the chained hash alone (the chain's
length is the end). Equal keys mean an identical prefix; a key names its whole prefix, so
two prompts' keys agree up to a point and never again. When the unit's end is inside a
trace block (``unit_tokens`` not a multiple of 512) the key includes that whole block:
stricter than needed, some hits are missed, never a false one. Keys are Python's
integer/tuple hashes (deterministic: no hash randomisation for ints), 64 bits wide.
"""

from __future__ import annotations

_last: tuple[tuple[int, ...] | None, int, int, int, tuple[int, ...]] = (None, 0, 0, 0, ())
"""The last prompt's keys, by the identity of its ``hash_ids`` (a router asks for every
replica of one decision, then the chosen replica looks up, usually before the next
request comes): an identity test instead of hashing the ids again. It keeps that
``hash_ids`` alive, so that no other tuple takes its id meanwhile."""


def unit_keys(
    hash_ids: tuple[int, ...], prompt_tokens: int, unit_tokens: int, source_tokens: int
) -> tuple[int, ...]:
    """Keys of the full cache units of a prompt (module docstring). Only units inside the
    prompt and covered by ``hash_ids`` have a key."""
    global _last
    ids, p, u, s, keys = _last
    if ids is hash_ids and p == prompt_tokens and u == unit_tokens and s == source_tokens:
        return keys
    keys = _unit_keys(hash_ids, prompt_tokens, unit_tokens, source_tokens)
    _last = (hash_ids, prompt_tokens, unit_tokens, source_tokens, keys)
    return keys


def _unit_keys(
    hash_ids: tuple[int, ...], prompt_tokens: int, unit_tokens: int, source_tokens: int
) -> tuple[int, ...]:
    covered = min(prompt_tokens, len(hash_ids) * source_tokens)
    n = covered // unit_tokens
    if n == 0:
        return ()
    prefix: list[int] = []  # the chained hash of each trace block
    append = prefix.append
    h = 0
    for block in hash_ids[: ((n * unit_tokens) - 1) // source_tokens + 1]:
        h = hash((h, block))
        append(h)
    if unit_tokens == source_tokens:  # unit i is trace block i: its chain ends there
        return tuple(prefix)
    ends = range(unit_tokens, n * unit_tokens + 1, unit_tokens)
    return tuple(hash((prefix[(end - 1) // source_tokens], end)) for end in ends)
