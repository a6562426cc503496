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

_RECENT: dict[tuple[int, int, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
"""The last prompts' keys, by the identity of their ``hash_ids`` (a router asks for every
replica of one decision, then the chosen replica looks up): an identity test instead of
hashing the ids again, as a cache keyed by the ids' value would. Each entry keeps its
``hash_ids`` alive, so that no other tuple takes its id while it is here."""

_RECENT_SIZE = 256


def unit_keys(
    hash_ids: tuple[int, ...], prompt_tokens: int, unit_tokens: int, source_tokens: int
) -> tuple[int, ...]:
    """Keys of the full cache units of a prompt (module docstring). Only units inside the
    prompt and covered by ``hash_ids`` have a key."""
    at = (id(hash_ids), prompt_tokens, unit_tokens, source_tokens)
    seen = _RECENT.get(at)
    if seen is not None and seen[0] is hash_ids:
        return seen[1]
    keys = _unit_keys(hash_ids, prompt_tokens, unit_tokens, source_tokens)
    _RECENT[at] = (hash_ids, keys)
    if len(_RECENT) > _RECENT_SIZE:
        del _RECENT[next(iter(_RECENT))]  # the oldest
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
